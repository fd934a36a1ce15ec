"""/healthz: 200 only while the database and Redis both answer."""

import pytest
from django.db import connection


@pytest.mark.django_db
def test_it_reports_database_and_redis(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["database"] == "ok" and body["redis"] == "ok"


@pytest.mark.django_db
def test_it_answers_503_when_redis_is_down(client, settings):
    # Overriding CACHES rebuilds the cache handlers (Django's setting_changed signal); port 1 refuses.
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}
    }
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["redis"].startswith("error")
    assert connection.is_usable()
