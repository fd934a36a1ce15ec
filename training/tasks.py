"""Celery tasks: ids in, a service call out."""

from celery import shared_task


@shared_task(name="training.tasks.run_step_task", acks_late=True, reject_on_worker_lost=True, time_limit=6 * 3600)
def run_step_task(run_id: int, step: int | None = None) -> None:
    from training.services.steps import run_step_execute

    run_step_execute(run_id=run_id, step=step)


@shared_task(
    name="training.tasks.rescore_execute_task", acks_late=True, reject_on_worker_lost=True, time_limit=6 * 3600
)
def rescore_execute_task(rescore_id: int) -> None:
    """Default queue: user code runs in the jail and no model is needed (RULER uses a judge endpoint)."""
    from training.services.rescores import rescore_execute

    rescore_execute(rescore_id=rescore_id)


@shared_task(name="training.tasks.runs_requeue_stale_task", ignore_result=True)
def runs_requeue_stale_task() -> None:
    """The sweep as a task, for an operator who schedules it with beat too; every worker already runs it
    on its own (training.sweeper)."""
    from training.sweeper import sweep

    sweep()


from training import serving_tasks as _serving_tasks  # noqa: E402,F401 - registers the serving jobs' task
from training.exports import tasks as _export_tasks  # noqa: E402,F401 - registers the export tasks
