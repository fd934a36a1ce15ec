"""/metrics is wired in artweb/urls.py; until then these tests serve it from a URLconf of their own."""

import pytest
from django.urls import path

from training.prometheus import metrics_view

urlpatterns = [path("metrics", metrics_view, name="metrics")]


@pytest.fixture(autouse=True)
def _metrics_url(settings):
    from django.urls import NoReverseMatch, reverse

    try:
        reverse("metrics")
    except NoReverseMatch:
        settings.ROOT_URLCONF = __name__
