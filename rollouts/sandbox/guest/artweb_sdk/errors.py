"""The one error the SDK raises for ART features that artweb's sandbox cannot honour.

A script that relies on such a feature must learn so at the line that uses it, never by a call that
quietly does nothing: the message names the feature, says why, and where there is one, what to do instead.
"""

from __future__ import annotations


class NotSupportedInSandbox(RuntimeError):
    """An ART feature that artweb cannot honour inside the sandbox (a RuntimeError, as ART's own
    refusals are): the message names it and says why."""

    def __init__(self, feature: str, why: str, instead: str | None = None) -> None:
        self.feature = feature
        message = f"{feature} is not available in artweb's sandbox: {why}"
        if instead:
            message += f" {instead}"
        super().__init__(message)


# Scripts know it as art.NotSupportedInSandbox; a rollout's error names it so.
NotSupportedInSandbox.__module__ = "art"


def training_is_artweb_s(feature: str) -> NotSupportedInSandbox:
    """The refusal for the training loop's own calls, which artweb runs itself from the run's settings."""
    return NotSupportedInSandbox(
        feature,
        "artweb runs the training loop itself, from the run's settings; a rollout script only produces trajectories.",
        "Pick the settings on the run's launch form.",
    )
