"""Bodies over ARTWEB_MAX_REQUEST_MB are refused by the ASGI application before Django reads them.

Requests go through artweb.asgi.application in-process: the real middleware, Django and the database.
"""

import httpx
import pytest
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.db import connections
from rest_framework.authtoken.models import Token

from artweb.asgi import application
from rollouts.models import ScenarioSet

pytestmark = pytest.mark.django_db(transaction=True)

MIB = 1024 * 1024
UPLOAD = "/api/v1/scenario-sets/create/"


@pytest.fixture
def one_mib_limit(settings):
    settings.ARTWEB_MAX_REQUEST_MB = 1


@pytest.fixture(autouse=True)
async def close_thread_connections():
    """The ORM calls of the test run in asgiref's worker thread; close its connection, so that the test
    database can be dropped at the end."""
    yield
    await sync_to_async(connections.close_all)()


def http_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://localhost")


def jsonl_of(size: int) -> bytes:
    line = b'{"prompt": "' + b"x" * 1000 + b'"}\n'
    return line * (size // len(line) + 1)


async def test_it_refuses_a_declared_length_over_the_limit_before_any_view(one_mib_limit):
    # No credentials: had the request reached Django, the answer would be 401.
    async with http_client() as client:
        response = await client.post(UPLOAD, files={"file": ("big.jsonl", jsonl_of(2 * MIB))}, data={"name": "big"})
    assert response.status_code == 413
    assert response.json() == {
        "message": "The request body is larger than 1 MiB, the limit set by ARTWEB_MAX_REQUEST_MB. Send less, "
        "or ask the operator to raise the limit.",
        "field_errors": {},
    }
    assert not await ScenarioSet.objects.aexists()


async def test_it_stops_reading_a_streamed_body_at_the_limit(one_mib_limit):
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": UPLOAD,
        "raw_path": UPLOAD.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"localhost"),
            (b"content-type", b"application/json"),
            (b"transfer-encoding", b"chunked"),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("localhost", 80),
    }
    app = ApplicationCommunicator(application, scope)
    chunk = b"x" * (MIB // 2)
    for _ in range(3):  # 1.5 MiB so far, and more announced
        await app.send_input({"type": "http.request", "body": chunk, "more_body": True})
    start = await app.receive_output(timeout=10)
    body = await app.receive_output(timeout=10)
    assert start["status"] == 413
    assert b"ARTWEB_MAX_REQUEST_MB" in body["body"]
    await app.wait(timeout=10)  # the application is done without ever seeing the end of the body


async def test_uploads_under_the_limit_still_work(one_mib_limit, alice):
    token = await sync_to_async(Token.objects.create)(user=alice)
    async with http_client() as client:
        response = await client.post(
            UPLOAD,
            files={"file": ("small.jsonl", jsonl_of(MIB // 2))},
            data={"name": "small", "validation_fraction": "0"},
            headers={"Authorization": f"Token {token.key}"},
        )
    assert response.status_code == 201, response.text
    assert await ScenarioSet.objects.filter(name="small", owner=alice).aexists()


async def test_pages_answer_the_limit_in_plain_text(one_mib_limit):
    async with http_client() as client:
        response = await client.post("/accounts/login/", content=b"x" * (2 * MIB))
    assert response.status_code == 413
    assert response.headers["content-type"].startswith("text/plain")
    assert "ARTWEB_MAX_REQUEST_MB" in response.text
