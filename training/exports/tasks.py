"""Export tasks, all on the "default" queue. Ids in, a service call out.

run_exports_task fans out to one export_sync_task per target, so a failing service is retried on its
own (with exponential backoff and jitter) and never holds back the others.
"""

from __future__ import annotations

from celery import shared_task

from training import task_names
from training.exports.base import ExportError
from training.exports.services import export_sync, export_targets_to_sync


@shared_task(name=task_names.RUN_EXPORTS, ignore_result=True, acks_late=True, time_limit=60)
def run_exports_task(run_id: int, reason: str = "step", step: int | None = None) -> None:
    for target_id in export_targets_to_sync(run_id=run_id):
        export_sync_task.apply_async(args=[target_id, run_id], queue="default")


@shared_task(
    name=task_names.EXPORT_SYNC,
    ignore_result=True,
    acks_late=True,
    autoretry_for=(ExportError,),
    retry_backoff=10,
    retry_backoff_max=15 * 60,
    retry_jitter=True,
    max_retries=8,
    soft_time_limit=10 * 60,
    time_limit=12 * 60,
)
def export_sync_task(target_id: int, run_id: int) -> int:
    """Bring one target up to date with one run. Failures are recorded, then retried (about 40 minutes
    of attempts in all); after that the next step or the run's end tries again from the same cursor."""
    return export_sync(target_id=target_id, run_id=run_id)
