"""The OpenAI endpoint's per-user rate (ARTWEB_THROTTLE_ENDPOINT): over it, a 429 in OpenAI's error shape with
Retry-After; each user counts alone. The cache is the API tests' local one (tests/api/conftest.py)."""

from __future__ import annotations

import json

import pytest
from rest_framework.authtoken.models import Token

from tests.api.conftest import api_settings  # noqa: F401  (the fixture, used by name)

# The endpoint reads the token on a thread of its own, with its own connection: the rows must be committed.
pytestmark = pytest.mark.django_db(transaction=True)
URL = "/api/v1/openai/chat/completions"


def ask(client, user) -> object:
    key = Token.objects.get_or_create(user=user)[0].key
    body = {"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}]}
    return client.post(URL, json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")


def test_a_user_over_the_endpoint_rate_gets_a_429_that_says_when_to_retry(client, alice, bob, api_settings):  # noqa: F811
    api_settings.REST_FRAMEWORK = {**api_settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"endpoint": "2/min"}}
    # Counted before the model is looked up: these two are answered (a 404 for the unknown model) ...
    assert [ask(client, alice).status_code for _ in range(2)] == [404, 404]
    refused = ask(client, alice)  # ... and the third is over the rate.
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and "2/min" in error["message"] and "Try again in" in error["message"]
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert ask(client, bob).status_code == 404  # bob's requests count on their own
