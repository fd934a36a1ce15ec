"""A run's live WebSocket opens only from a page of the site itself: the Origin must match the connection's
scheme, host and port, or be listed in CSRF_TRUSTED_ORIGINS (finding 8 of the security review: a page
on another port of the same host, http://127.0.0.1:9999, read a signed-in user's run socket, since the
origin check compared host names only)."""

import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from artweb.asgi import application
from artweb.testing.factories import RunFactory
from tests.artweb.live import LiveServer

pytestmark = pytest.mark.django_db(transaction=True)


def _cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


async def _connects(run_id: int, user, *, host: str, origin: str | None) -> bool:
    headers = [(b"cookie", (await sync_to_async(_cookie)(user)).encode()), (b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    comm = WebsocketCommunicator(application, f"/ws/runs/{run_id}/", headers=headers)
    connected, _ = await comm.connect()
    await comm.disconnect()
    return connected


@pytest.mark.slow
async def test_it_opens_only_from_the_sites_own_origin(alice):
    run = await sync_to_async(RunFactory)(owner=alice)
    site = "127.0.0.1:8000"
    assert await _connects(run.id, alice, host=site, origin="http://127.0.0.1:8000")
    assert await _connects(run.id, alice, host="localhost", origin="http://localhost:80")  # the default port
    for origin in (
        "http://127.0.0.1:9999",  # another port of the same host
        "http://127.0.0.1",  # port 80, not 8000
        "https://127.0.0.1:8000",  # another scheme
        "http://localhost:8000",  # another host name
        "null",  # a sandboxed frame or a file
        None,  # no Origin at all
    ):
        assert not await _connects(run.id, alice, host=site, origin=origin), origin


async def test_a_host_the_site_does_not_serve_is_refused_even_from_its_own_origin(alice):
    """A name rebound to 127.0.0.1 (DNS rebinding) makes a foreign page "same-origin" with the server."""
    run = await sync_to_async(RunFactory)(owner=alice)
    assert not await _connects(run.id, alice, host="evil.example:8000", origin="http://evil.example:8000")


async def test_an_origin_listed_in_csrf_trusted_origins_opens(alice, settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://app.example.com", "https://*.example.org"]
    run = await sync_to_async(RunFactory)(owner=alice)
    assert await _connects(run.id, alice, host="127.0.0.1:8000", origin="https://app.example.com")
    assert await _connects(run.id, alice, host="127.0.0.1:8000", origin="https://eu.example.org")
    assert not await _connects(run.id, alice, host="127.0.0.1:8000", origin="http://app.example.com")


@pytest.mark.slow
def test_a_real_server_refuses_another_ports_page_and_serves_its_own(tmp_path, alice):
    run = RunFactory(owner=alice, status="running")
    server = LiveServer(tmp_path).start()
    try:
        url = server.url.replace("http://", "ws://") + f"/ws/runs/{run.id}/"
        cookie = _cookie(alice)
        with pytest.raises(InvalidStatus) as refused:
            connect(url, additional_headers={"Cookie": cookie, "Origin": "http://127.0.0.1:9999"}, open_timeout=10)
        assert refused.value.response.status_code == 403
        with connect(url, additional_headers={"Cookie": cookie, "Origin": server.url}, open_timeout=10) as ws:
            ws.send(json.dumps({"type": "catch_up", "after_step": 0, "after_event": 0, "after_log": 0}))
            assert json.loads(ws.recv(timeout=10))["type"] == "status"
    finally:
        server.stop()
