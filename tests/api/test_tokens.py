"""API tokens: created with a password or a session, shown once, revocable; the admin lists them."""

import base64

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from tests.api.conftest import assert_error

pytestmark = pytest.mark.django_db


def basic(username, password):
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def test_it_creates_a_token_with_username_and_password(anon_api, alice):
    response = anon_api.post("/api/v1/tokens/", HTTP_AUTHORIZATION=basic("alice", "alice-pass-123"))
    assert response.status_code == 201
    key = response.json()["key"]
    assert Token.objects.get(user=alice).key == key
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/v1/runs/").status_code == 200


def test_a_wrong_password_gets_no_token(anon_api, alice):
    assert_error(anon_api.post("/api/v1/tokens/", HTTP_AUTHORIZATION=basic("alice", "nope")), 401)
    assert not Token.objects.exists()


def test_a_new_token_replaces_the_old_one(alice_api, alice):
    old = Token.objects.get(user=alice).key
    new = alice_api.post("/api/v1/tokens/").json()["key"]
    assert new != old and Token.objects.get(user=alice).key == new
    assert_error(alice_api.get("/api/v1/runs/"), 401)  # the client still sends the old key


def test_a_browser_session_can_create_a_token(alice):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(alice)
    # Session-authenticated writes need the CSRF token, as from the dashboard page.
    assert_error(client.post("/api/v1/tokens/"), 403, contains="CSRF")
    client.get("/api/v1/tokens/current/")
    from django.middleware.csrf import _get_new_csrf_string

    csrf = _get_new_csrf_string()
    client.cookies["csrftoken"] = csrf
    assert client.post("/api/v1/tokens/", HTTP_X_CSRFTOKEN=csrf).status_code == 201


def test_it_shows_only_a_prefix_and_revokes(alice_api, alice):
    key = Token.objects.get(user=alice).key
    body = alice_api.get("/api/v1/tokens/current/").json()
    assert body["exists"] is True and body["prefix"] == key[:6] and key not in str(body)
    assert alice_api.post("/api/v1/tokens/revoke/").json() == {"revoked": True}
    assert not Token.objects.filter(user=alice).exists()
    assert_error(alice_api.get("/api/v1/tokens/current/"), 401)


def test_the_admin_lists_and_deletes_tokens(client, staff, alice):
    Token.objects.create(user=alice)
    client.force_login(staff)
    page = client.get("/admin/authtoken/tokenproxy/")
    assert page.status_code == 200 and b"alice" in page.content
    # The admin addresses a token by its user (DRF's TokenProxy).
    response = client.post(f"/admin/authtoken/tokenproxy/{alice.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not Token.objects.exists()


def test_repeated_wrong_passwords_lock_the_token_endpoint(anon_api, alice, settings):
    def post(password):
        return anon_api.post("/api/v1/tokens/", HTTP_AUTHORIZATION=basic("alice", password))

    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert_error(post("nope"), 401)
    assert_error(post("nope"), 429, contains="Too many failed sign-ins")

    response = post("alice-pass-123")
    assert_error(response, 429, contains="Too many failed sign-ins; try again in 15 minutes")
    assert response["Retry-After"] == "900"
    assert not Token.objects.exists()


def test_a_successful_basic_sign_in_resets_the_count(anon_api, alice, settings):
    def post(password):
        return anon_api.post("/api/v1/tokens/", HTTP_AUTHORIZATION=basic("alice", password))

    for _ in range(2):
        for _ in range(settings.AXES_FAILURE_LIMIT - 1):
            assert_error(post("nope"), 401)
        assert post("alice-pass-123").status_code == 201
