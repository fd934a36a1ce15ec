from celery import shared_task


@shared_task(name="rollouts.tasks.dry_run_task", acks_late=True, time_limit=600)
def dry_run_task(dry_run_id: int) -> None:
    from training.services.inference import dry_run_execute

    dry_run_execute(dry_run_id=dry_run_id)
