"""Trajectory groups and trajectories: keyset pages, filters, details, JSONL export, ownership."""

import json

import pytest

from artweb.testing.factories import RunFactory
from tests.api.conftest import assert_error
from training.models import Trajectory, TrajectoryGroup

pytestmark = pytest.mark.django_db


@pytest.fixture
def filled_run(alice):
    """3 steps x 2 groups x 4 trajectories; rewards 0..1 by index; one error; text to search for."""
    run = RunFactory(owner=alice)
    scenarios = list(run.scenario_set.scenarios.all())
    for step in (1, 2, 3):
        for g in range(2):
            group = TrajectoryGroup.objects.create(
                run=run,
                step=step,
                scenario=scenarios[g],
                split="validation" if (step == 3 and g == 1) else "train",
                reward_mean=0.5,
            )
            Trajectory.objects.bulk_create(
                [
                    Trajectory(
                        group=group,
                        run=run,
                        step=step,
                        index=i,
                        reward=i / 3,
                        messages=[
                            {"role": "user", "content": f"q{step}"},
                            {"role": "assistant", "content": "needle" if (step, g, i) == (2, 0, 3) else "a"},
                        ],
                        search_text="needle" if (step, g, i) == (2, 0, 3) else f"q{step} a",
                        error="timeout" if (step, g, i) == (1, 1, 0) else "",
                        logs=["log line"],
                    )
                    for i in range(4)
                ]
            )
    return run


def test_it_pages_trajectories_in_order_with_a_cursor(alice_api, filled_run):
    seen, cursor = [], None
    while True:
        url = f"/api/v1/runs/{filled_run.id}/trajectories/?limit=5" + (f"&cursor={cursor}" if cursor else "")
        page = alice_api.get(url).json()
        seen += [(t["step"], t["group_id"], t["index"]) for t in page["results"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert len(seen) == 24 and seen == sorted(seen) and len(set(seen)) == 24
    assert "logs" not in page["results"][0]  # the list is light; the detail has everything


@pytest.mark.parametrize(
    "query, count",
    [
        ("step=2", 8),
        ("min_reward=0.9", 6),
        ("max_reward=0.1", 6),
        ("min_reward=0.3&max_reward=0.4", 6),
        ("q=NEEDLE", 1),
        ("has_error=true", 1),
        ("has_error=false", 23),
        ("split=validation", 4),
        ("step=9", 0),
    ],
)
def test_it_filters_trajectories(alice_api, filled_run, query, count):
    page = alice_api.get(f"/api/v1/runs/{filled_run.id}/trajectories/?limit=200&{query}").json()
    assert len(page["results"]) == count, query


@pytest.mark.parametrize(
    "query, field",
    [
        ("cursor=garbage", "cursor"),
        ("cursor=WzEsMl0", "cursor"),
        ("limit=0", "limit"),
        ("limit=1000", "limit"),
        ("min_reward=nan", "min_reward"),
        ("min_reward=inf", "min_reward"),
        ("step=-3", "step"),
        ("has_error=maybe", "has_error"),
        ("split=test", "split"),
    ],
)
def test_it_rejects_bad_trajectory_queries(alice_api, filled_run, query, field):
    assert_error(alice_api.get(f"/api/v1/runs/{filled_run.id}/trajectories/?{query}"), 400, field=field)


def test_it_shows_a_trajectory_in_full(alice_api, filled_run, bob_api):
    traj = filled_run.trajectories.get(step=2, index=3, group__scenario__index=0)
    body = alice_api.get(f"/api/v1/runs/{filled_run.id}/trajectories/{traj.id}/").json()
    assert body["logs"] == ["log line"] and body["messages"][1]["content"] == "needle"
    assert_error(bob_api.get(f"/api/v1/runs/{filled_run.id}/trajectories/{traj.id}/"), 404)


def test_a_trajectorys_additional_histories_come_with_its_detail_and_its_export(alice_api, filled_run):
    traj = filled_run.trajectories.get(step=1, index=2, group__scenario__index=0)
    critic = [{"messages": [{"role": "user", "content": "Was it right?"}], "tools": None}]
    traj.additional_histories = critic
    traj.save(update_fields=["additional_histories"])
    body = alice_api.get(f"/api/v1/runs/{filled_run.id}/trajectories/{traj.id}/").json()
    assert body["additional_histories"] == critic
    response = alice_api.get(f"/api/v1/runs/{filled_run.id}/trajectories/export/?step=1")
    rows = [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]
    assert [r["additional_histories"] for r in rows if r["id"] == traj.id] == [critic]
    assert all(r["additional_histories"] == [] for r in rows if r["id"] != traj.id)


def test_a_trajectory_is_found_only_under_its_own_run(alice_api, alice, filled_run):
    other = RunFactory(owner=alice)
    traj = filled_run.trajectories.first()
    assert_error(alice_api.get(f"/api/v1/runs/{other.id}/trajectories/{traj.id}/"), 404)


def test_it_lists_groups_and_shows_one_with_its_trajectories(alice_api, filled_run, bob_api):
    page = alice_api.get(f"/api/v1/runs/{filled_run.id}/groups/?limit=4").json()
    assert len(page["results"]) == 4 and page["next_cursor"]
    rest = alice_api.get(f"/api/v1/runs/{filled_run.id}/groups/?cursor={page['next_cursor']}").json()
    assert len(rest["results"]) == 2 and rest["next_cursor"] is None
    validation = alice_api.get(f"/api/v1/runs/{filled_run.id}/groups/?split=validation").json()["results"]
    assert [(g["step"], g["split"]) for g in validation] == [(3, "validation")]
    group_id = page["results"][0]["id"]
    body = alice_api.get(f"/api/v1/runs/{filled_run.id}/groups/{group_id}/").json()
    assert [t["index"] for t in body["trajectories"]] == [0, 1, 2, 3]
    assert body["scenario"]["answer"] == "w0"
    assert_error(bob_api.get(f"/api/v1/runs/{filled_run.id}/groups/{group_id}/"), 404)


def test_it_exports_jsonl_streamed(alice_api, filled_run):
    response = alice_api.get(f"/api/v1/runs/{filled_run.id}/trajectories/export/")
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"] == "application/x-ndjson"
    assert "attachment" in response["Content-Disposition"]
    lines = b"".join(response.streaming_content).decode().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == 24 and rows[0]["logs"] == ["log line"] and rows[0]["group_id"]
    assert [(r["step"], r["index"]) for r in rows][:4] == [(1, 0), (1, 1), (1, 2), (1, 3)]


def test_it_exports_more_rows_than_one_chunk(alice_api, alice, monkeypatch):
    from training.apis import trajectories

    monkeypatch.setattr(trajectories, "EXPORT_CHUNK_ROWS", 7)
    run = RunFactory(owner=alice)
    group = TrajectoryGroup.objects.create(run=run, step=1, scenario=run.scenario_set.scenarios.first())
    Trajectory.objects.bulk_create([Trajectory(group=group, run=run, step=1, index=i) for i in range(30)])
    response = alice_api.get(f"/api/v1/runs/{run.id}/trajectories/export/?min_reward=-1")
    assert b"".join(response.streaming_content) == b""  # rewards are null: the filter keeps none
    response = alice_api.get(f"/api/v1/runs/{run.id}/trajectories/export/")
    rows = [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]
    assert [r["index"] for r in rows] == list(range(30))
