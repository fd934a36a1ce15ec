"""The stale sweep: active runs nobody is working on are queued again (training.sweeper calls it)."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from artweb.dispatch import publish
from training import task_names
from training.models import Run
from training.services.runs import run_event
from training.services.steps.leases import stale_after

S = Run.Status


def runs_requeue_stale() -> list[int]:
    """Requeue active runs that nobody is working on.

    Two cases: the run's worker stopped heartbeating (killed, lost its host), or no worker holds the run
    and none has for stale_after() (a worker died between releasing one step and claiming the next, and
    the next step's message waits unacknowledged until the broker's visibility timeout). A duplicate step
    message is harmless: the step task is idempotent.
    """
    now = timezone.now()
    cutoff = now - stale_after()
    requeued = []
    for run in Run.objects.filter(status__in=(S.STARTING, S.RUNNING), heartbeat_at__lt=cutoff):
        with transaction.atomic():
            if (
                Run.objects.filter(id=run.id, worker=run.worker, heartbeat_at__lt=cutoff).update(
                    worker="", heartbeat_at=now
                )
                != 1
            ):
                continue
            if run.worker:
                message = f"Worker {run.worker} stopped heartbeating; requeued from step {run.steps_done}."
            else:
                message = f"No worker took step {run.steps_done + 1}; queued it again."
            run_event(
                run=run, kind="requeued", message=message, data={"worker": run.worker, "steps_done": run.steps_done}
            )
            transaction.on_commit(
                lambda rid=run.id, nxt=run.steps_done + 1: publish(
                    task_names.RUN_STEP, args=(rid,), kwargs={"step": nxt}
                )
            )
        requeued.append(run.id)
    return requeued
