"""The Django project (settings, urls, ASGI and Celery wiring), the launcher, and the REST client and command
line. Importing the package loads nothing: artweb.apps makes the Celery app current when Django starts."""
