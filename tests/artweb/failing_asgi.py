"""artweb's ASGI application with one more view, /test-fail/, that raises: the error-page tests run the
server in its own process, where a test cannot monkeypatch a view to fail."""

import importlib

from django.conf import settings
from django.urls import path

from artweb.asgi import application  # noqa: F401  (served; importing it sets Django up)


def fail(request):
    broker = settings.CELERY_BROKER_URL  # a local variable, listed by the technical 500 page
    raise RuntimeError(f"cannot reach the broker at {broker}")


importlib.import_module(settings.ROOT_URLCONF).urlpatterns.insert(0, path("test-fail/", fail))
