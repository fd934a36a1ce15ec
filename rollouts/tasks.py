from celery import shared_task


@shared_task(name="rollouts.tasks.dry_run_task", acks_late=True, time_limit=600)
def dry_run_task(dry_run_id: int) -> None:
    from training.services.inference import dry_run_execute
    from training.services.serving import serving_paused

    with serving_paused():  # requests to the OpenAI endpoint wait until the dry run is done
        dry_run_execute(dry_run_id=dry_run_id)
