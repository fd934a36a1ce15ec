from django.apps import AppConfig


class TrainingConfig(AppConfig):
    name = "training"
    verbose_name = "Training"

    def ready(self) -> None:
        # The dry-run form appears on the rollouts pages of scripts, rewards and scenario sets; rollouts
        # renders the panels registered for its pages and never imports training (artweb.pages).
        from training.views.dry_runs import dry_run_panels_register

        dry_run_panels_register()
