"""The run WebSocket: authentication, ownership, live messages after commit, catch-up from cursors.
Uses the real Redis channel layer and the real ASGI application in-process."""

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from artweb.asgi import application
from artweb.testing.factories import RunFactory, StepFactory
from training.services.broadcast import broadcast_now, run_group_name, runs_list_groups
from training.services.logs import run_log

pytestmark = pytest.mark.django_db(transaction=True)


# A page of the site itself: the browser sends the server's host and port as Host, and the page's origin.
SAME_ORIGIN = [(b"host", b"localhost"), (b"origin", b"http://localhost")]


def _headers(user):
    client = Client()
    client.force_login(user)
    return [(b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()), *SAME_ORIGIN]


async def _connect(path, user=None):
    headers = await sync_to_async(_headers)(user) if user else SAME_ORIGIN
    comm = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await comm.connect()
    return comm, connected, code


async def test_it_refuses_anonymous_and_other_users(alice, bob):
    run = await sync_to_async(RunFactory)(owner=bob)
    for user in (None, alice):
        comm, connected, code = await _connect(f"/ws/runs/{run.id}/", user)
        assert not connected and code == 4403
        await comm.disconnect()


async def test_it_forwards_group_messages_and_catches_up_from_cursors(alice):
    # Training its third step on a worker (a run between steps waits in the queue, and hears its place too).
    run = await sync_to_async(RunFactory)(owner=alice, status="running", steps_done=2, worker="gpu-1:1")
    await sync_to_async(StepFactory)(run=run, step=1)
    await sync_to_async(StepFactory)(run=run, step=2)
    await sync_to_async(run_log)(run_id=run.id, message="hello")
    comm, connected, _ = await _connect(f"/ws/runs/{run.id}/", alice)
    assert connected

    await comm.send_json_to({"type": "catch_up", "after_step": 1, "after_event": 0, "after_log": 0})
    got = [await comm.receive_json_from(timeout=5) for _ in range(3)]
    assert got[0]["type"] == "status" and got[0]["steps_done"] == 2
    assert [m["step"] for m in got if m["type"] == "step"] == [2]
    assert [m["message"] for m in got if m["type"] == "log"] == ["hello"]

    await sync_to_async(broadcast_now)(run_group_name(run.id), {"type": "step", "step": 3, "metrics": {}})
    assert (await comm.receive_json_from(timeout=5))["step"] == 3
    await comm.disconnect()


async def test_the_runs_socket_forwards_only_own_runs(alice, bob):
    mine = await sync_to_async(RunFactory)(owner=alice)
    theirs = await sync_to_async(RunFactory)(owner=bob)
    comm, connected, _ = await _connect("/ws/runs/", alice)
    assert connected
    for run in (theirs, mine):  # each to every runs list that may show it
        for group in runs_list_groups(run.owner_id):
            await sync_to_async(broadcast_now)(group, {"type": "status", "run": run.id, "status": "running"})
    assert (await comm.receive_json_from(timeout=5))["run"] == mine.id
    assert await comm.receive_nothing(timeout=0.5)
    await comm.disconnect()


async def test_staff_may_follow_anyones_run_and_the_status_names_its_actions(alice, staff):
    """The status message carries what the status allows (training.services.runs.run_actions): the
    page's buttons follow it."""
    run = await sync_to_async(RunFactory)(owner=alice, status="paused")
    comm, connected, _ = await _connect(f"/ws/runs/{run.id}/", staff)
    assert connected
    await comm.send_json_to({"type": "catch_up"})
    status = await comm.receive_json_from(timeout=5)
    assert status["type"] == "status" and status["actions"] == ["cancel", "resume"]
    await comm.disconnect()
