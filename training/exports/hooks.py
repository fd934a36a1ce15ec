"""The step loop's two calls into exports. Each only enqueues a task on the "default" queue.

Both are called after the step's (or the run's) transaction has committed. They never raise and never
wait on anything slower than handing a message to the broker, so a GPU worker loses no time to exports:
if even that fails, the next step's call (or the run's end) picks up whatever was missed, because each
export resumes from its own cursor.
"""

from __future__ import annotations

import logging

from artweb.dispatch import send
from training import task_names

logger = logging.getLogger(__name__)

# A broker that does not answer within this is treated as down: the step loop does not wait for it.
_PUBLISH_RETRY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}


def _enqueue(run_id: int, reason: str, step: int | None = None) -> None:
    try:
        send(
            task_names.RUN_EXPORTS,
            args=[run_id],
            kwargs={"reason": reason, "step": step},
            queue="default",
            retry=True,
            retry_policy=_PUBLISH_RETRY,
        )
    except Exception:  # exports must never fail a run
        logger.warning("could not enqueue exports (%s)", reason, exc_info=True, extra={"run_id": run_id, "step": step})


def step_committed(*, run_id: int, step: int) -> None:
    """A step's row is committed: mirror it to the run's export targets."""
    _enqueue(run_id, "step", step)


def run_finished(*, run_id: int) -> None:
    """The run reached completed, failed or cancelled: export what is left and close the remote runs."""
    _enqueue(run_id, "finished")
