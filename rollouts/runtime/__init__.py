"""The pure rollout runtime: the SDK rollout scripts import, the sandbox that runs them, the vLLM
inference service, and RULER. Never imports Django; services turn rows into these typed requests.
"""


class Cancelled(Exception):
    """should_stop() said stop: the sandbox was killed and no results are returned, or the trainer
    (training.engine, which raises this same class) stopped an update before its optimizer step."""


class TooManyErrors(RuntimeError):
    """More rollouts failed than the request's max_exceptions allows; `groups` holds what finished."""

    def __init__(self, message: str, groups: list | None = None) -> None:
        super().__init__(message)
        self.groups = groups or []
