from django.apps import AppConfig


class ArtwebConfig(AppConfig):
    """The project's wiring, loaded in every process that starts Django."""

    name = "artweb"

    def ready(self) -> None:
        # The Celery app becomes the current one here, before any task is sent, rather than on `import
        # artweb`: the REST client and the command line (artweb.client, artweb.cli) load neither Celery
        # nor Django. A worker (`celery -A artweb`) finds the app in artweb.celery by itself.
        from artweb import celery  # noqa: F401
