"""How a step ends early: StepFailed (it cannot succeed as configured) and StepAborted (cancelled, paused,
or the lease went to another worker)."""

from __future__ import annotations


class StepFailed(RuntimeError):
    """The step cannot succeed as configured; the message says why and what was kept."""


class StepAborted(Exception):
    """The run was cancelled or paused while the step was in progress."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
