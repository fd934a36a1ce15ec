"""Live groups on the run page: each scored group goes out when its transaction commits, with its rewards,
and again once the step's update has stored its advantages; a reconnecting page catches up from its
group cursor. The step service's own functions persist the groups; the real Redis channel layer and the
real ASGI application carry them."""

from types import SimpleNamespace

import pytest
from asgiref.sync import sync_to_async

from artweb.testing.factories import RunFactory, TrajectoryFactory, TrajectoryGroupFactory
from tests.training.test_consumers import _connect
from training.selectors import GROUPS_SHOWN, run_groups_latest
from training.services import broadcast
from training.services.broadcast import ANSWER_CHARS, group_message, run_group_messages
from training.services.steps.groups import advantages_store, groups_persist

GROUP_KEYS = {
    "type",
    "run",
    "id",
    "step",
    "split",
    "scenario",
    "scenario_index",
    "reward_mean",
    "reward_std",
    "error_count",
    "skipped",
    "failed_attempt",
    "rewards",
    "advantages",
    "best",
    "worst",
}


def _traj(answer: str, reward: float | None, error: str = "") -> dict:
    return {
        "messages": [
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": answer, "token_ids": [1, 2], "logprobs": [-1.0, -1.0]},
        ],
        "reward": reward,
        "error": error,
        "completion_tokens": 2,
    }


def _results() -> list:
    """Two scored groups as the sandbox returns them: one with signal, one whose rewards are all equal."""
    return [
        SimpleNamespace(
            trajectories=[_traj("red", 1.0), _traj("blue", 0.0), _traj("", None, error="boom"), _traj("green", 0.5)]
        ),
        SimpleNamespace(trajectories=[_traj("cyan", 0.5), _traj("teal", 0.5)]),
    ]


def _persist(run, step=1):
    scenarios = list(run.scenario_set.scenarios.filter(split="train").order_by("index")[:2])
    type(run).objects.filter(id=run.id).update(worker="worker-1")  # the lease, as a claim would set it
    return groups_persist(run, step, "train", scenarios, _results(), me="worker-1")


@pytest.mark.django_db
def test_it_sends_each_group_only_after_the_transaction_commits(django_capture_on_commit_callbacks, monkeypatch, alice):
    sent = []
    monkeypatch.setattr(broadcast, "broadcast_now", lambda group, message: sent.append((group, message)))
    run = RunFactory(owner=alice)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        groups = _persist(run)
        assert sent == []  # written, not committed: nothing has left yet
    assert len(callbacks) == 2
    assert [g for g, _ in sent] == [f"run_{run.id}"] * 2
    first, second = (m for _, m in sent)
    assert set(first) == GROUP_KEYS
    assert first == {
        **first,
        "type": "group",
        "run": run.id,
        "id": groups[0].id,
        "step": 1,
        "split": "train",
        "scenario": groups[0].scenario_id,
        "scenario_index": 0,  # the number the inspector and the heatmap show, not the id
        "error_count": 1,
        "skipped": False,
        "failed_attempt": False,
        "rewards": [1.0, 0.0, None, 0.5],
        "advantages": None,  # the update has not run yet
    }
    assert first["reward_mean"] == pytest.approx(0.5)
    assert first["best"]["text"] == "red" and first["best"]["reward"] == 1.0 and first["best"]["index"] == 0
    assert first["worst"]["text"] == "blue" and first["worst"]["index"] == 1
    assert first["best"]["trajectory"] == groups[0].trajectories.get(index=0).id
    # Equal rewards: no signal, and still two answers to compare.
    assert second["skipped"] is True and [second["best"]["text"], second["worst"]["text"]] == ["cyan", "teal"]

    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        advantages_store(groups, [[1.2, -1.2, None, 0.0], [0.0, 0.0]])
        assert sent == []
    updated = {m["id"]: m for _, m in sent}
    assert updated[groups[0].id]["advantages"] == [1.2, -1.2, None, 0.0]
    assert updated[groups[0].id]["best"]["advantage"] == 1.2
    assert updated[groups[1].id]["advantages"] == [0.0, 0.0]


@pytest.mark.django_db
def test_it_builds_the_same_message_from_the_database_in_three_queries(django_assert_num_queries, alice):
    run = RunFactory(owner=alice)
    live = []
    groups = _persist(run)
    for group in groups:
        live.append(group_message(group, list(group.trajectories.all())))
    for _ in range(5):
        g = TrajectoryGroupFactory(run=run, step=2)
        TrajectoryFactory(group=g, index=0, reward=0.0)
        TrajectoryFactory(group=g, index=1, reward=1.0)
    with django_assert_num_queries(3):
        caught_up = run_group_messages(run_id=run.id)
    assert caught_up[:2] == live
    assert [m["id"] for m in caught_up] == sorted(m["id"] for m in caught_up)


@pytest.mark.django_db
def test_it_keeps_the_newest_groups_and_those_asked_for(alice):
    run = RunFactory(owner=alice)
    ids = [TrajectoryGroupFactory(run=run, step=1 + i // 4).id for i in range(GROUPS_SHOWN + 6)]
    assert [g.id for g, _ in run_groups_latest(run_id=run.id)] == ids[-GROUPS_SHOWN:]
    newer = [g.id for g, _ in run_groups_latest(run_id=run.id, after_id=ids[-3], ids=[ids[0], ids[-4]])]
    assert newer == [ids[0], ids[-4], ids[-2], ids[-1]]


def test_it_cuts_long_answers():
    long = "x" * (ANSWER_CHARS * 2)
    assert len(broadcast.final_answer([{"role": "assistant", "content": long}])) == ANSWER_CHARS
    calls = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "lookup", "arguments": '{"q": "a"}'}}],
        },
        {"role": "tool", "content": "found"},
    ]
    assert broadcast.final_answer(calls) == 'lookup({"q": "a"})'


@pytest.mark.django_db(transaction=True)
async def test_it_pushes_groups_to_the_run_page_and_catches_up_after_a_cursor(alice):
    run = await sync_to_async(RunFactory)(owner=alice, status="running")
    comm, connected, _ = await _connect(f"/ws/runs/{run.id}/", alice)
    assert connected

    groups = await sync_to_async(_persist)(run)
    got = [await comm.receive_json_from(timeout=5) for _ in groups]
    assert [m["id"] for m in got] == [g.id for g in groups]
    assert got[0]["rewards"] == [1.0, 0.0, None, 0.5] and got[0]["advantages"] is None

    # A page that saw the first group, and shows it without advantages, reconnects after the update.
    await sync_to_async(advantages_store)(groups, [[1.2, -1.2, None, 0.0], [0.0, 0.0]])
    for _ in groups:  # the live updates, on commit
        assert (await comm.receive_json_from(timeout=5))["advantages"] is not None
    await comm.send_json_to(
        {
            "type": "catch_up",
            "after_step": 0,
            "after_event": 10**9,
            "after_log": 10**9,
            "after_group": groups[0].id,
            "pending_groups": [groups[0].id],
        }
    )
    status = await comm.receive_json_from(timeout=5)
    assert status["type"] == "status"
    caught = [await comm.receive_json_from(timeout=5) for _ in groups]
    assert [(m["type"], m["id"]) for m in caught] == [("group", groups[0].id), ("group", groups[1].id)]
    assert caught[0]["advantages"] == [1.2, -1.2, None, 0.0]
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()


@pytest.mark.django_db
def test_a_worker_without_the_lease_persists_nothing_and_keeps_the_winners_groups(alice):
    from training.services.steps import StepAborted

    run = RunFactory(owner=alice)
    winners = _persist(run)
    type(run).objects.filter(id=run.id).update(worker="worker-2")  # another worker took the run over
    scenarios = list(run.scenario_set.scenarios.filter(split="train").order_by("index")[:2])
    with pytest.raises(StepAborted, match="lease lost"):
        groups_persist(run, 1, "train", scenarios, _results(), me="worker-1")
    assert sorted(g.id for g in run.groups.all()) == sorted(g.id for g in winners)
