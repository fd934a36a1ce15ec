"""Failed sign-ins on the form lock that username out from that address for a while (django-axes)."""

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.urls import reverse
from django.utils import timezone

pytestmark = pytest.mark.django_db

LOCKED = "Too many failed sign-ins; try again in 15 minutes."


@pytest.fixture(autouse=True)
def fast_hashing(settings):
    # The personas' passwords are checked many times here; the production hasher costs ~1 s each.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def sign_in(client, username, password, **extra):
    return client.post(reverse("login"), {"username": username, "password": password}, **extra)


def signed_in(client) -> bool:
    return "_auth_user_id" in client.session


def test_it_locks_out_after_the_failure_limit_even_with_the_right_password(client, alice, settings):
    assert settings.AXES_FAILURE_LIMIT == 5 and settings.AXES_COOLOFF_TIME == timedelta(minutes=15)
    for _ in range(4):
        response = sign_in(client, "alice", "wrong")
        assert response.status_code == 200 and "Please enter a correct username" in response.content.decode()
    response = sign_in(client, "alice", "wrong")
    assert response.status_code == 429 and LOCKED in response.content.decode()

    response = sign_in(client, "alice", "alice-pass-123")
    assert response.status_code == 429
    assert LOCKED in response.content.decode() and response["Retry-After"] == "900"
    assert not signed_in(client)
    # The address is what the connection says; a header the client writes does not make a new one.
    assert sign_in(client, "alice", "alice-pass-123", HTTP_X_FORWARDED_FOR="10.9.9.9").status_code == 429


def test_it_locks_the_username_only_from_that_address(client, alice, bob):
    for _ in range(5):
        sign_in(client, "alice", "wrong")
    assert sign_in(client, "bob", "bob-pass-123").status_code == 302
    client.logout()
    assert sign_in(client, "alice", "alice-pass-123", REMOTE_ADDR="10.0.0.2").status_code == 302


def test_a_successful_sign_in_resets_the_count(client, alice):
    for _ in range(4):
        sign_in(client, "alice", "wrong")
    assert sign_in(client, "alice", "alice-pass-123").status_code == 302
    client.logout()
    for _ in range(4):
        assert sign_in(client, "alice", "wrong").status_code == 200
    assert sign_in(client, "alice", "alice-pass-123").status_code == 302 and signed_in(client)


def test_the_lockout_ends_after_the_cool_off(client, alice):
    for _ in range(5):
        sign_in(client, "alice", "wrong")
    assert sign_in(client, "alice", "alice-pass-123").status_code == 429
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    assert sign_in(client, "alice", "alice-pass-123").status_code == 302 and signed_in(client)
