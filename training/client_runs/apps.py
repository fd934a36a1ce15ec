from django.apps import AppConfig


class ClientRunsConfig(AppConfig):
    name = "training.client_runs"
    label = "client_runs"
    verbose_name = "Client-driven runs"

    def ready(self) -> None:
        # The step machinery takes a client-driven run's groups from here; training never imports this app.
        from training.client_runs.source import CLIENT_SOURCE
        from training.models import Run
        from training.services.steps.sources import step_source_register

        step_source_register(Run.Driver.CLIENT, CLIENT_SOURCE)
