"""What a signed-in user can make the server show (finding 2 of the security review, the debug page of
the Redis chain): with `make run`'s defaults, a deeply nested body is a 400, a server error is the plain
500 page (no settings, no URL with its password), a 404 lists no URL patterns; and even with DEBUG=true
the technical 500 page masks the password of every URL, in settings, variables and messages alike.

The server runs as the launcher starts it (tests.artweb.live); the 500 comes from one extra view that
raises (tests.artweb.failing_asgi), since a test cannot monkeypatch a view in another process.
"""

import secrets

import httpx
import pytest
from django.test import RequestFactory, override_settings
from django.views.debug import technical_500_response
from rest_framework.authtoken.models import Token

from artweb.error_reports import mask_url_passwords
from tests.artweb.live import REDIS_PASSWORD, LiveServer

NESTED = b"[" * 50_000 + b"]" * 50_000


@pytest.fixture
def server(tmp_path, request):
    live = LiveServer(tmp_path, app="tests.artweb.failing_asgi:application", **getattr(request, "param", {})).start()
    yield live
    live.stop()


@pytest.mark.django_db(transaction=True)
def test_with_the_launchers_defaults_a_nested_body_is_a_400_and_errors_show_nothing(server, alice):
    assert "DEBUG" not in server.env and REDIS_PASSWORD in server.env["REDIS_URL"]
    token = Token.objects.create(user=alice).key
    with httpx.Client(base_url=server.url, timeout=30) as http:
        nested = http.post(
            "/api/v1/scripts/validate/",
            content=NESTED,
            headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
        )
        assert nested.status_code == 400, nested.text[:500]
        assert "nesting depth limit is 64" in nested.json()["message"]

        failed = http.get("/test-fail/")
        assert failed.status_code == 500
        assert "Something went wrong on the server" in failed.text
        for shown in ("REDIS_URL", "CELERY_BROKER_URL", REDIS_PASSWORD, "Traceback", "SECRET_KEY", "DATA_DIR"):
            assert shown not in failed.text
        # The operator's log has the whole traceback, the URL's password masked.
        assert "cannot reach the broker at redis://default:********@127.0.0.1" in server.output()
        assert REDIS_PASSWORD not in server.output()

        missing = http.get("/no-such-page/")
        assert missing.status_code == 404
        assert "Not found" in missing.text
        assert "api/v1/" not in missing.text and "URLconf" not in missing.text


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server", [{"DEBUG": "true"}], indirect=True)
def test_even_the_debug_pages_technical_500_masks_url_passwords(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        failed = http.get("/test-fail/", headers={"Accept": "text/html"})
    assert failed.status_code == 500
    assert "cannot reach the broker at" in failed.text and "REDIS_URL" in failed.text  # the technical page
    assert REDIS_PASSWORD not in failed.text
    assert "redis://default:********@127.0.0.1" in failed.text


@override_settings(DEBUG=True)
def test_the_technical_page_masks_every_url_password_in_process(settings):
    """Settings by any name (in dicts and lists too), local variables and the exception's message."""
    secret = secrets.token_hex(12)  # not a literal: the page shows the source lines around the raise
    settings.REDIS_URL = f"redis://:{secret}@cache.internal:6379/0"
    settings.ARTWEB_SOME_LIST = [f"amqp://user:{secret}@broker/vhost"]
    settings.CHANNEL_LAYERS = {"default": {"CONFIG": {"hosts": [{"address": f"rediss://u:{secret}@h:6380/1"}]}}}
    request = RequestFactory().get("/", HTTP_X_UPSTREAM=f"https://me:{secret}@example.com/")
    try:
        url = f"postgres://art:{secret}@db:5432/prod"  # noqa: F841  (a frame variable the page lists)
        raise RuntimeError(f"connecting to {settings.REDIS_URL} failed")
    except RuntimeError as exc:
        page = technical_500_response(request, type(exc), exc, exc.__traceback__).content.decode()
    assert secret not in page
    assert page.count("********") >= 4


def test_it_masks_only_the_password_of_a_url():
    assert mask_url_passwords("redis://:pw@h:6379/0 and amqp://u:p%40ss@b/v") == (
        "redis://:********@h:6379/0 and amqp://u:********@b/v"
    )
    assert mask_url_passwords("https://example.com/a@b and user@example.com") == (
        "https://example.com/a@b and user@example.com"
    )


@pytest.mark.django_db
def test_a_deeply_nested_form_field_is_an_error_on_the_form(client, alice):
    """JSON typed into a web form goes through the same limit: the page says so, nothing fails."""
    client.force_login(alice)
    response = client.post(
        "/models/",
        {"name": "m", "source": "org/name", "max_length": 2048, "recommended_train": "[" * 50_000 + "]" * 50_000},
    )
    assert response.status_code == 200
    assert "nesting depth limit is 64" in response.content.decode()
