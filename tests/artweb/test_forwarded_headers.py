"""Forwarded headers are believed only from ARTWEB_TRUSTED_PROXIES (finding 7 of the security review).

Uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise, so a client on this machine could
name a fresh address with every password guess: the lockout (per username and address) never came, and a
locked user signed in from a "new" address. Here the server runs as the launcher starts it, and the
guesses come from 127.0.0.1 with a fresh X-Forwarded-For each.
"""

import httpx
import pytest
from axes.models import AccessAttempt

from tests.artweb.live import LiveServer

pytestmark = pytest.mark.django_db(transaction=True)

LOCKED = "Too many failed sign-ins; try again in 15 minutes."


@pytest.fixture
def server(tmp_path, request):
    live = LiveServer(tmp_path, **getattr(request, "param", {})).start()
    yield live
    live.stop()


def sign_in(http: httpx.Client, username: str, password: str, *, forwarded_for: str) -> httpx.Response:
    http.get("/accounts/login/")
    return http.post(
        "/accounts/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": http.cookies["csrftoken"]},
        headers={"X-Forwarded-For": forwarded_for},
    )


def test_a_fresh_forwarded_address_per_guess_still_locks_the_account(server, alice):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for i in range(4):
            wrong = sign_in(http, "alice", "wrong", forwarded_for=f"203.0.113.{i + 1}")
            assert wrong.status_code == 200 and "Please enter a correct username" in wrong.text
        assert sign_in(http, "alice", "wrong", forwarded_for="203.0.113.99").status_code == 429
        # Locked: the right password, from yet another claimed address, does not sign alice in.
        right = sign_in(http, "alice", "alice-pass-123", forwarded_for="198.51.100.7")
        assert right.status_code == 429 and LOCKED in right.text
        assert "sessionid" not in http.cookies
        assert http.get("/", follow_redirects=False).status_code == 302  # still signed out
    assert set(AccessAttempt.objects.filter(username="alice").values_list("ip_address", flat=True)) == {"127.0.0.1"}


@pytest.mark.parametrize("server", [{"ARTWEB_TRUSTED_PROXIES": "127.0.0.1"}], indirect=True)
def test_a_listed_proxy_names_the_client(server, alice):
    """Behind a proxy the operator lists, the address it forwards is the client's."""
    assert server.command[server.command.index("--forwarded-allow-ips") + 1] == "127.0.0.1"
    with httpx.Client(base_url=server.url, timeout=60) as http:
        assert sign_in(http, "alice", "wrong", forwarded_for="203.0.113.5").status_code == 200
    assert list(AccessAttempt.objects.values_list("ip_address", flat=True)) == ["203.0.113.5"]
