from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "training.serving"
    label = "serving"
    verbose_name = "Serving"

    def ready(self) -> None:
        # Serve jobs are background jobs: the sweep (training.sweeper) sends their owed messages and
        # recovers them, as it does training's.
        from training.jobs.kinds import job_kind_register
        from training.serving.services.serve_jobs import SERVE_JOBS

        job_kind_register(SERVE_JOBS)
