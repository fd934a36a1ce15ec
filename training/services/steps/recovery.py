"""A step that lost its database or its inference server mid-way: queued again (a bounded number of
times for the inference server), never failed for it."""

from __future__ import annotations

import time

from django.db import InterfaceError, OperationalError, connections, transaction

from artweb.dispatch import publish
from training import task_names
from training.models import Run
from training.services.logs import run_log
from training.services.runs import run_event
from training.services.steps.leases import run_release

DATABASE_WAIT_SECONDS = 120


def requeue_after_database_loss(run_id: int, step: int, me: str) -> bool:
    """Once the database answers again, give up the lease and queue the step again. If it stays away
    longer than DATABASE_WAIT_SECONDS, the sweep requeues the run once its lease is stale."""
    deadline = time.monotonic() + DATABASE_WAIT_SECONDS
    while time.monotonic() < deadline:
        connections.close_all()  # broken ones: the next query connects anew
        try:
            with transaction.atomic():
                run_release(run_id=run_id, me=me)
                transaction.on_commit(lambda: publish(task_names.RUN_STEP, args=(run_id,), kwargs={"step": step}))
            run_log(
                run_id=run_id,
                step=step,
                level="WARNING",
                message=f"step {step}: the database connection was lost mid-step; the step is tried again",
            )
            return True
        except (OperationalError, InterfaceError):
            time.sleep(2)
    return False


INFERENCE_RETRIES = 2  # attempts at one step after the inference server died under it


INFERENCE_RESTARTED_EVENT = "inference_restarted"


def retry_after_inference_death(run_id: int, step: int, me: str, exc: Exception) -> bool:
    """The inference server died during the step: queue the step again (the next attempt restarts the
    server with the policy it served) unless this step already had INFERENCE_RETRIES such retries."""
    run = Run.objects.get(id=run_id)
    tried = run.events.filter(kind=INFERENCE_RESTARTED_EVENT, data__step=step).count()
    if tried >= INFERENCE_RETRIES or run.status not in Run.ACTIVE_STATUSES:
        return False
    with transaction.atomic():
        run_event(
            run=run,
            kind=INFERENCE_RESTARTED_EVENT,
            data={"step": step, "retry": tried + 1, "level": "warning"},
            message=(
                f"The inference server stopped during step {step} ({type(exc).__name__}: {str(exc)[:300]}); it is "
                f"restarted and the step tried again (retry {tried + 1} of {INFERENCE_RETRIES}). The failed attempt's "
                "rollouts are kept in the trajectory inspector."
            ),
        )
        run_release(run_id=run_id, me=me)
        transaction.on_commit(lambda: publish(task_names.RUN_STEP, args=(run_id,), kwargs={"step": step}))
    return True
