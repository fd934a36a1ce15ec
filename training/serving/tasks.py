"""Celery tasks of the serving app: ids in, a service call out. Services queue them by name
(training.task_names)."""

from celery import shared_task

from training import task_names
from training.serving.services.serve_jobs import serve_job_execute


@shared_task(name=task_names.SERVE_JOB_EXECUTE, acks_late=True, reject_on_worker_lost=True, time_limit=6 * 3600)
def serve_job_execute_task(job_id: int) -> None:
    """Default queue: the answers come from the serving workers, and user code runs in the jail."""
    serve_job_execute(job_id=job_id)
