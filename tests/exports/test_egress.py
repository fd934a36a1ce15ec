"""Export targets and the egress guard: what a user names as their W&B, Weave or Langfuse server is reached
from the worker's and the web server's network, so it goes through the guard like every connection made
on a user's behalf (rollouts.sandbox.egress).

The targets that point at a private address here are written as rows directly, as a target saved before
the guard existed would be, or one whose name was pointed at 127.0.0.1 since: saving one is refused
(the first tests), and the connection-time check is the one that counts. The stand-ins for private
services are real listeners on 127.0.0.1 (tests/egress.py); the W&B and Weave clients are the real ones.
"""

from __future__ import annotations

import pytest

from artweb.errors import ApplicationError
from tests.egress import Listener, Web, egress_allow
from training.exports.services import export_target_create, export_target_test, export_target_update
from training.models import ExportTarget

KEY = "wandbkey" + "w" * 32
SECRET = "SECRET-BANNER redis_version:7.2.4 role:master"
URL_FIELD = {"wandb": "base_url", "weave": "base_url", "langfuse": "host"}
# weave is a dependency of artweb: the weave cases fail, never skip, without it.
KINDS = ["langfuse", "wandb", "weave"]


def settings_for(kind: str, url: str) -> dict:
    if kind == "langfuse":
        return {"host": url, "public_key": "pk-lf-public"}
    return {"project": "team/agents" if kind == "weave" else "agents", "base_url": url}


@pytest.fixture(autouse=True)
def fast_clients(monkeypatch, tmp_path):
    """The W&B client's own retries would take a minute against a server that is not W&B."""
    import training.exports.wandb as wandb_export

    monkeypatch.setattr(wandb_export, "TEST_INIT_TIMEOUT_S", 3.0)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture
def banner():
    """A private service that is not HTTP (a Redis, say): it answers anything with its banner."""
    server = Listener(f"-ERR {SECRET}\r\n".encode())
    yield server
    server.close()


@pytest.fixture
def admin_page():
    """A private HTTP service: an admin page answering 500 with something worth reading."""
    server = Web(500, f"<html><h1>{SECRET}</h1></html>".encode(), {"Content-Type": "text/html"})
    yield server
    server.close()


@pytest.mark.parametrize("kind", ["langfuse", "wandb", "weave"])
@pytest.mark.parametrize(
    "url, says",
    [
        ("http://127.0.0.1:6379", "127.0.0.1 is a loopback address"),
        ("http://localhost:5432", "localhost resolves to 127.0.0.1, which is a loopback address"),
        ("http://169.254.169.254", "169.254.169.254 is a link-local"),
        ("http://[::ffff:127.0.0.1]", "an IPv4-mapped IPv6 address"),
        ("https://10.0.0.5", "10.0.0.5 is a private network address"),
        ("http://100.100.100.200", "carrier-grade NAT"),
    ],
)
def test_a_target_naming_a_private_server_is_refused_when_saved(alice, kind, url, says):
    with pytest.raises(ApplicationError) as exc:
        export_target_create(owner=alice, kind=kind, settings=settings_for(kind, url), secret=KEY)
    field = f"settings.{URL_FIELD[kind]}"
    assert says in exc.value.message and "ARTWEB_EGRESS_ALLOW=" in exc.value.message
    assert field in exc.value.field_errors and not ExportTarget.objects.exists()


def test_changing_a_target_to_a_private_server_is_refused_too(alice):
    target = export_target_create(owner=alice, kind="langfuse", settings={"public_key": "pk"}, secret="sk-lf-1234")
    with pytest.raises(ApplicationError, match="ARTWEB_EGRESS_ALLOW=127.0.0.1:5432"):
        export_target_update(target=target, actor=alice, settings=settings_for("langfuse", "http://127.0.0.1:5432"))
    target.refresh_from_db()
    assert target.settings["host"] == ""


def test_the_api_answers_400_naming_the_address_and_the_setting(alice):
    from tests.api.conftest import token_client

    response = token_client(alice).post(
        "/api/v1/export-targets/create/",
        {"kind": "weave", "settings": {"project": "team/p", "base_url": "http://127.0.0.1:6379"}},
        format="json",
    )
    assert response.status_code == 400
    body = response.json()
    assert "127.0.0.1 is a loopback address" in body["message"] and "ARTWEB_EGRESS_ALLOW" in body["message"]


def _stored(owner, kind: str, url: str) -> ExportTarget:
    """A target row as one saved before the guard, or whose name was pointed elsewhere since."""
    from training.exports.crypto import secret_encrypt

    secret = "sk-lf-secret-5678" if kind == "langfuse" else KEY
    return ExportTarget.objects.create(
        owner=owner,
        kind=kind,
        settings={**settings_for(kind, url), **({"mode": "online"} if kind == "wandb" else {})},
        secret_encrypted=secret_encrypt(secret),
    )


@pytest.mark.parametrize("kind", KINDS)
def test_the_test_event_to_a_private_server_is_refused_without_connecting(alice, banner, kind):
    """The web process used to connect to any host:port and quote up to 300 characters of the answer:
    enough to tell a Redis from a PostgreSQL on the server's own network."""
    target = _stored(alice, kind, banner.url)
    result = export_target_test(target=target, actor=alice)
    assert not result.ok
    assert "127.0.0.1 is a loopback address" in result.message
    assert f"ARTWEB_EGRESS_ALLOW=127.0.0.1:{banner.port}" in result.message
    assert banner.connections == 0 and "SECRET" not in result.message


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("server", ["banner", "admin_page"])
def test_where_the_operator_allows_it_the_test_event_connects_but_quotes_no_body(
    alice, settings, kind, server, request
):
    """With ARTWEB_EGRESS_ALLOW naming that host and port, the test event is sent there; what answers is
    no export service, and nothing of its answer beyond a status line reaches the person."""
    listener = request.getfixturevalue(server)
    egress_allow(settings, listener.url)
    target = _stored(alice, kind, listener.url)
    result = export_target_test(target=target, actor=alice)
    assert not result.ok, result.message
    reached = listener.connections if server == "banner" else len(listener.paths)
    assert reached >= 1
    assert "SECRET" not in result.message and "redis_version" not in result.message
    target.refresh_from_db()
    assert "SECRET" not in target.last_error


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["langfuse", "wandb"])
def test_a_redirect_of_the_users_server_is_not_followed(alice, settings, kind):
    """The user's server (allowed here) answers 307 toward another server; W&B's own client, which
    follows redirects, goes through the local egress proxy, which does not."""
    inner = Web(200, b'{"data": {}}')
    outer = Web(307, b"", {"Location": f"{inner.url}/graphql"})
    try:
        egress_allow(settings, outer.url)
        egress_allow(settings, inner.url)  # even an allowed server is not reached by a redirect
        target = _stored(alice, kind, outer.url)
        result = export_target_test(target=target, actor=alice)
    finally:
        outer.close()
        inner.close()
    assert not result.ok
    assert "answered HTTP 307 Temporary Redirect, a redirect to 127.0.0.1" in result.message, result.message
    assert outer.paths and inner.paths == []


@pytest.mark.parametrize("kind", ["langfuse", "wandb"])
def test_an_export_from_the_worker_is_refused_the_same_way(run_with_steps, banner, kind):
    from training.exports.base import ExportError
    from training.exports.services import export_sync

    target = _stored(run_with_steps.owner, kind, banner.url)
    with pytest.raises(ExportError) as exc:
        export_sync(target_id=target.id, run_id=run_with_steps.id)
    assert f"ARTWEB_EGRESS_ALLOW=127.0.0.1:{banner.port}" in str(exc.value)
    assert banner.connections == 0


def test_the_weave_test_process_connects_nowhere_but_through_the_egress_proxy(banner):
    """weave opens its own connections; its test process gets the egress proxy as its HTTP(S) proxy, and a
    client that ignored that setting could connect anywhere. The process's audit hook refuses that, and
    any program it would start; the proxy's own port stays open to it."""
    import subprocess
    import sys

    from training.exports.weave import EGRESS_ONLY

    probe = EGRESS_ONLY + (
        "import socket, subprocess\n"
        "for port in (int(sys.argv[1]), int(sys.argv[2])):\n"
        "    try:\n"
        "        socket.create_connection(('127.0.0.1', port), timeout=5).close()\n"
        "        print(port, 'connected')\n"
        "    except OSError as exc:\n"
        "        print(port, type(exc).__name__)\n"
        "try:\n"
        "    subprocess.run(['true'])\n"
        "except OSError as exc:\n"
        "    print('program', type(exc).__name__)\n"
    )
    proxy = Listener()  # stands for the egress proxy's port
    try:
        out = subprocess.run(
            [sys.executable, "-c", probe, str(banner.port), str(proxy.port)],
            env={"ARTWEB_EGRESS_PROXY_PORT": str(proxy.port), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        proxy.close()
    assert out.stdout.split("\n")[:3] == [
        f"{banner.port} PermissionError",
        f"{proxy.port} connected",
        "program PermissionError",
    ], out.stderr
    assert banner.connections == 0
