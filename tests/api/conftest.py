"""API test helpers: token-authenticated clients for the personas, and settings the API relies on.

The exception handler and a process-local cache are set here so the tests neither depend on the
settings module having them yet nor share throttle counters (kept in the cache) with other test
sessions on the same Redis.
"""

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from artweb.testing.factories import (
    BaseModelFactory,
    RewardFunctionVersionFactory,
    RolloutScriptVersionFactory,
    ScenarioSetFactory,
)


@pytest.fixture(autouse=True)
def api_settings(settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "EXCEPTION_HANDLER": "artweb.api_errors.exception_handler"}
    # The personas' passwords are hashed on creation; the production hasher costs about a second each here.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "artweb-api-tests"}
    }
    from django.core.cache import cache

    cache.clear()
    return settings


def token_client(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


@pytest.fixture
def alice_api(alice):
    return token_client(alice)


@pytest.fixture
def bob_api(bob):
    return token_client(bob)


@pytest.fixture
def staff_api(staff):
    return token_client(staff)


@pytest.fixture
def anon_api(db):
    return APIClient()


@pytest.fixture
def base_model(db):
    return BaseModelFactory()


@pytest.fixture
def alice_assets(alice, base_model):
    """alice's script, reward and scenario set (made with factories: no upload validation needed)."""
    return {
        "script": RolloutScriptVersionFactory(asset__owner=alice, asset__name="alice-script"),
        "reward": RewardFunctionVersionFactory(asset__owner=alice, asset__name="alice-reward"),
        "scenario_set": ScenarioSetFactory(owner=alice, name="alice-scenarios"),
        "base_model": base_model,
    }


def assert_error(response, status: int, *, field: str | None = None, contains: str | None = None):
    """The one error shape: a message (what to fix) and field_errors."""
    assert response.status_code == status, (response.status_code, getattr(response, "data", response.content))
    body = response.json()
    assert set(body) == {"message", "field_errors"}, body
    assert isinstance(body["message"], str) and body["message"], body
    if field is not None:  # the field itself or a part of it ("config.num_steps", "scenarios.0")
        assert any(k == field or k.startswith(field + ".") for k in body["field_errors"]), body
    if contains is not None:
        assert contains.lower() in body["message"].lower(), body
    return body
