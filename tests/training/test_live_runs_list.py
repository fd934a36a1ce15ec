"""The live runs list: a run created anywhere reaches its owner's runs lists (and the staff's) after
commit, one row message built by the service; other people's sockets never see it. Real Redis channel
layer, real ASGI application."""

import pytest
from asgiref.sync import sync_to_async

from artweb.testing.factories import RunFactory
from tests.training.test_consumers import _connect
from training.models import Run
from training.services import run_create, run_transition

pytestmark = pytest.mark.django_db(transaction=True)

ROW_KEYS = {
    "type",
    "run",
    "name",
    "tags",
    "status",
    "steps_done",
    "num_steps",
    "latest_reward",
    "best_val_reward",
    "base_model",
    "task",
    "task_version",
    "owner",
    "created_at",
    "started_at",
}


def _create_like(template: Run, owner, name: str) -> Run:
    return run_create(
        owner=owner,
        name=name,
        base_model=template.base_model,
        script_version=template.script_version,
        reward_version=template.reward_version,
        scenario_set=template.scenario_set,
        config={"num_steps": 4},
        tags=["live"],
        start=False,
    )


async def test_it_shows_a_new_run_to_its_owner_and_the_staff_only(alice, bob, staff):
    template = await sync_to_async(RunFactory)(owner=alice)
    sockets = {}
    for who in (alice, bob, staff):
        sockets[who.username], connected, _ = await _connect("/ws/runs/", who)
        assert connected

    run = await sync_to_async(_create_like)(template, alice, "fresh")
    for who in ("alice", "sam"):
        msg = await sockets[who].receive_json_from(timeout=5)
        assert set(msg) == ROW_KEYS
        assert msg == {
            **msg,
            "type": "run",
            "run": run.id,
            "name": "fresh",
            "tags": ["live"],
            "status": "queued",
            "steps_done": 0,
            "num_steps": 4,
            "owner": "alice",
            "base_model": template.base_model.name,
            "task": template.script_version.asset.name,
            "started_at": None,
        }
        assert await sockets[who].receive_nothing(timeout=0.3)  # once, for the staff too
    assert await sockets["bob"].receive_nothing(timeout=0.3)

    # Status changes follow the same routes.
    await sync_to_async(run_transition)(run=run, from_statuses=("queued",), to_status="starting")
    assert (await sockets["alice"].receive_json_from(timeout=5))["status"] == "starting"
    assert (await sockets["sam"].receive_json_from(timeout=5))["status"] == "starting"
    assert await sockets["bob"].receive_nothing(timeout=0.3)
    for comm in sockets.values():
        await comm.disconnect()


async def test_it_catches_up_new_runs_and_the_rows_shown(alice, bob):
    shown = await sync_to_async(RunFactory)(owner=alice, status="running", steps_done=2, worker="gpu-1:1")
    newer = await sync_to_async(RunFactory)(owner=alice)  # queued: it waits in the fair queue
    theirs = await sync_to_async(RunFactory)(owner=bob)
    comm, connected, _ = await _connect("/ws/runs/", alice)
    assert connected
    # The page shows `shown` (and asks about bob's run, which it must not learn anything of).
    await comm.send_json_to({"type": "catch_up", "after_run": shown.id, "runs": [shown.id, theirs.id]})
    got = [await comm.receive_json_from(timeout=5) for _ in range(3)]
    assert [(m["type"], m["run"]) for m in got] == [("run", shown.id), ("run", newer.id), ("queue", newer.id)]
    assert got[0]["status"] == "running" and got[0]["steps_done"] == 2
    assert got[2]["place"] == 1 and got[2]["ahead"] == 0  # queued before bob's run: next
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()
