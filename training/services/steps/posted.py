"""The step's parts for a run whose groups a client posts (a step source: training.services.steps.sources):
its input taken in place of rollouts, a failure told to the source, and the run back to waiting for its
client when no input is left."""

from __future__ import annotations

import time

from django.db import transaction

from training.config import RunConfig
from training.models import Run
from training.services.runs import run_transition
from training.services.steps.errors import StepAborted
from training.services.steps.groups import reward_stats
from training.services.steps.sources import step_source


def posted_take(run: Run, cfg: RunConfig, step: int, source, timings: dict) -> tuple:
    """The groups a client posted for this step, in the shape of a batch's results."""
    t = time.perf_counter()
    posted = source.take(run, step)
    if posted is None:  # taken by another attempt that is gone: the client posts again
        raise StepAborted("nothing posted")
    timings["rollouts"] = time.perf_counter() - t
    return posted, posted.groups, posted.scenarios, 0, None, reward_stats(posted.groups, cfg)


def posted_failed(run: Run, message: str) -> bool:
    """Tell a step source its step ended without a commit; False for a run without one."""
    source = step_source(run)
    if source is None:
        return False
    posted = source.take(run, run.steps_done + 1) if source.pending(run) else None
    if posted is not None:
        source.failed(posted, message)
    return True


def nothing_posted(run: Run, me: str) -> bool:
    """A client-driven run with no training job waiting goes back to waiting for its client (under the
    run's row lock, which a new job's post takes too: a job posted meanwhile is never left unseen)."""
    source = step_source(run)
    if source is None:
        return False
    with transaction.atomic():
        run = Run.objects.select_for_update().get(id=run.id)
        if source.pending(run):
            return False
        _client_wait(run, me, f"Waiting for the client's next training job (step {run.steps_done} is the latest).")
    return True


def _client_wait(run: Run, me: str, message: str) -> None:
    run_transition(run=run, from_statuses=Run.ACTIVE_STATUSES, to_status=Run.Status.WAITING, message=message, worker="")
