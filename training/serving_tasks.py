"""Celery task of the playground and the answer diff (training.services.serve_jobs): default queue, since
the answers come from the serving workers and user code runs in the jail."""

from celery import shared_task


@shared_task(
    name="training.tasks.serve_job_execute_task", acks_late=True, reject_on_worker_lost=True, time_limit=6 * 3600
)
def serve_job_execute_task(job_id: int) -> None:
    from training.services.serve_jobs import serve_job_execute

    serve_job_execute(job_id=job_id)
