"""Celery tasks: ids in, a service call out."""

from celery import shared_task


@shared_task(name="training.tasks.run_step_task", acks_late=True)
def run_step_task(run_id: int) -> None:
    from training.services.steps import run_step_execute

    run_step_execute(run_id=run_id)
