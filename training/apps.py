from django.apps import AppConfig


class TrainingConfig(AppConfig):
    name = "training"
    verbose_name = "Training"

    def ready(self) -> None:
        # The dry-run form appears on the rollouts pages of scripts, rewards and scenario sets; rollouts
        # renders the panels registered for its pages and never imports training (artweb.pages).
        from training.views.dry_runs import dry_run_panels_register

        dry_run_panels_register()
        # The background jobs of this app, for the sweep (training.sweeper); the serving app adds its own.
        from training.analytics.rescores import RESCORE_JOBS
        from training.jobs.kinds import job_kind_register
        from training.services.dry_runs import DRY_RUN_JOBS
        from training.services.runs import RUN_JOBS

        for kind in (RUN_JOBS, DRY_RUN_JOBS, RESCORE_JOBS):
            job_kind_register(kind)
        # The attachment quota and the runs that still need an attachment, for rollouts' attachment services.
        from training.services.attachments import attachment_rules_install

        attachment_rules_install()
