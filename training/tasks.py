"""Celery tasks: ids in, a service call out. Services queue them by name (training.task_names)."""

from celery import shared_task

from training import task_names
from training.analytics.rescores import rescore_execute
from training.exports import tasks as _export_tasks  # noqa: F401 - registers the export tasks
from training.services.dry_runs import dry_run_execute
from training.services.serving_gate import serving_paused
from training.services.steps import run_step_execute
from training.sweeper import sweep


@shared_task(name=task_names.RUN_STEP, acks_late=True, reject_on_worker_lost=True, time_limit=6 * 3600)
def run_step_task(run_id: int, step: int | None = None) -> None:
    run_step_execute(run_id=run_id, step=step)


@shared_task(name=task_names.RESCORE_EXECUTE, acks_late=True, reject_on_worker_lost=True, time_limit=6 * 3600)
def rescore_execute_task(rescore_id: int) -> None:
    """Default queue: user code runs in the jail and no model is needed (RULER uses a judge endpoint)."""
    rescore_execute(rescore_id=rescore_id)


@shared_task(name=task_names.DRY_RUN, acks_late=True, time_limit=600)
def dry_run_task(dry_run_id: int) -> None:
    """GPU queue: the dry run uses this worker's inference server."""
    with serving_paused():  # requests answered between steps (serving_gate) wait until the dry run is done
        dry_run_execute(dry_run_id=dry_run_id)


@shared_task(name=task_names.RUNS_REQUEUE_STALE, ignore_result=True)
def runs_requeue_stale_task() -> None:
    """The sweep as a task, for an operator who schedules it with beat too; every worker already runs it
    on its own (training.sweeper)."""
    sweep()
