"""Runs: list, detail, create (queue), lifecycle actions, metrics, events, logs — with ownership and bad input."""

from unittest import mock

import pytest

from artweb.testing.factories import RunFactory, StepFactory
from tests.api.conftest import assert_error
from training.models import Run, RunEvent, RunLog, Step

pytestmark = pytest.mark.django_db


def create_payload(assets, **overrides):
    payload = {
        "name": "first",
        "base_model": assets["base_model"].name,
        "script": "alice-script",
        "reward": "alice-reward",
        "scenario_set": "alice-scenarios",
        "config": {"num_steps": 5},
        "tags": ["demo"],
    }
    payload.update(overrides)
    return payload


@pytest.fixture
def enqueued():
    """run_create queues run_step_task after commit; no worker runs in these tests, so the queueing call
    itself is replaced and recorded (the test transaction never commits, so it would not fire anyway)."""
    with (
        mock.patch("artweb.dispatch.transaction.on_commit", side_effect=lambda send: send()),
        mock.patch("training.tasks.run_step_task.apply_async") as send,
    ):
        yield send


# --- list and detail ---------------------------------------------------------------------------------


def test_it_lists_only_the_users_runs(alice_api, alice, bob):
    mine = RunFactory(owner=alice, tags=["x"])
    RunFactory(owner=bob)
    response = alice_api.get("/api/v1/runs/")
    assert response.status_code == 200
    assert response.json()["count"] == 1
    assert [r["id"] for r in response.json()["results"]] == [mine.id]


def test_it_filters_runs(alice_api, alice):
    a = RunFactory(owner=alice, name="alpha", tags=["keep"], status=Run.Status.COMPLETED)
    RunFactory(owner=alice, name="beta", tags=["other"])
    assert [r["id"] for r in alice_api.get("/api/v1/runs/?status=completed").json()["results"]] == [a.id]
    assert [r["id"] for r in alice_api.get("/api/v1/runs/?tag=keep").json()["results"]] == [a.id]
    assert [r["id"] for r in alice_api.get("/api/v1/runs/?q=alph").json()["results"]] == [a.id]
    assert alice_api.get("/api/v1/runs/?limit=1").json()["count"] == 2


def test_it_rejects_a_bad_filter(alice_api):
    assert_error(alice_api.get("/api/v1/runs/?status=flying"), 400, field="status")
    assert_error(alice_api.get("/api/v1/runs/?order=password"), 400, field="order")


def test_it_shows_a_run_with_its_config(alice_api, alice):
    run = RunFactory(owner=alice, config={"num_steps": 3})
    body = alice_api.get(f"/api/v1/runs/{run.id}/").json()
    assert body["id"] == run.id and body["config"] == {"num_steps": 3}
    assert body["script"]["name"] == run.script_version.asset.name
    assert body["owner"] == "alice"


def test_it_hides_other_users_runs(alice_api, bob):
    theirs = RunFactory(owner=bob, name="bobs-secret")
    for path in (
        "",
        "metrics/",
        "events/",
        "logs/",
        "groups/",
        "trajectories/",
        "trajectories/export/",
        "checkpoints/",
    ):
        response = alice_api.get(f"/api/v1/runs/{theirs.id}/{path}")
        body = assert_error(response, 404)
        assert "bobs-secret" not in response.content.decode()
        assert body["field_errors"] == {}


def test_staff_see_every_run(staff_api, bob):
    theirs = RunFactory(owner=bob)
    assert staff_api.get(f"/api/v1/runs/{theirs.id}/").status_code == 200


def test_it_requires_authentication(anon_api, alice):
    run = RunFactory(owner=alice)
    body = assert_error(anon_api.get(f"/api/v1/runs/{run.id}/"), 401)
    assert "Token" in body["message"]
    assert_error(anon_api.get("/api/v1/runs/", HTTP_AUTHORIZATION="Token not-a-real-key"), 401)


# --- create --------------------------------------------------------------------------------------------


def test_it_creates_and_queues_a_run_by_names(alice_api, alice_assets, enqueued):
    response = alice_api.post("/api/v1/runs/create/", create_payload(alice_assets), format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    run = Run.objects.get(id=body["id"])
    assert run.status == Run.Status.QUEUED and run.num_steps == 5 and run.tags == ["demo"]
    assert run.script_version == alice_assets["script"] and run.reward_version == alice_assets["reward"]
    assert body["config"]["num_steps"] == 5 and body["config"]["group_size"] == 6  # defaults filled in
    enqueued.assert_called_once_with(args=(run.id,), kwargs={})
    assert RunEvent.objects.filter(run=run, kind="created").count() == 1


def test_it_creates_a_run_by_ids_and_version(alice_api, alice_assets, enqueued):
    payload = create_payload(
        alice_assets,
        base_model=alice_assets["base_model"].id,
        script=alice_assets["script"].asset_id,
        script_version=1,
        reward=None,
        scenario_set=alice_assets["scenario_set"].id,
    )
    response = alice_api.post("/api/v1/runs/create/", payload, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["reward"] is None


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"config": {"num_steps": 0}}, "num_steps"),
        ({"config": {"group_size": 1000}}, "group_size"),
        ({"config": {"temperature": "hot"}}, "temperature"),
        ({"config": {"warp_drive": True}}, "warp_drive"),
        ({"config": {"train": {"learning_rate": -1}}}, "train"),
    ],
)
def test_it_rejects_an_out_of_range_config_and_writes_nothing(alice_api, alice_assets, enqueued, overrides, field):
    body = assert_error(
        alice_api.post("/api/v1/runs/create/", create_payload(alice_assets, **overrides), format="json"), 400
    )
    assert any(k.startswith(field) for k in body["field_errors"]), body
    assert "config" in body["message"].lower()
    assert not Run.objects.exists() and not RunEvent.objects.exists()
    enqueued.assert_not_called()


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"name": ""}, "name"),
        ({"name": "x" * 201}, "name"),
        ({"config": [1, 2]}, "config"),
        ({"tags": "not-a-list"}, "tags"),
        ({"script": ["a"]}, "script"),
        ({"script": True}, "script"),
        ({"script_version": "two"}, "script_version"),
        ({"script_version": 99}, "script_version"),
        ({"script": "no-such-script"}, "script"),
        ({"base_model": 10**6}, "base_model"),
    ],
)
def test_it_rejects_wrong_types_and_unknown_references(alice_api, alice_assets, enqueued, overrides, field):
    assert_error(
        alice_api.post("/api/v1/runs/create/", create_payload(alice_assets, **overrides), format="json"),
        400,
        field=field,
    )
    assert not Run.objects.exists()


def test_it_rejects_malformed_json(alice_api, alice_assets):
    body = assert_error(
        alice_api.post("/api/v1/runs/create/", '{"name": "x", ', content_type="application/json"), 400, contains="JSON"
    )
    assert body["field_errors"] == {}
    assert_error(alice_api.post("/api/v1/runs/create/", "[1, 2]", content_type="application/json"), 400)
    assert_error(alice_api.post("/api/v1/runs/create/", '{"name": NaN}', content_type="application/json"), 400)
    assert_error(
        alice_api.post("/api/v1/runs/create/", b'{"name": "\xff"}', content_type="application/json"),
        400,
        contains="UTF-8",
    )
    assert not Run.objects.exists()


def test_it_rejects_nul_characters(alice_api, alice_assets):
    assert_error(
        alice_api.post("/api/v1/runs/create/", create_payload(alice_assets, name="a\x00b"), format="json"),
        400,
        field="name",
    )


def test_it_rejects_an_oversized_body(alice_api):
    response = alice_api.post(
        "/api/v1/runs/create/", '{"name": "' + "x" * (2 * 1024 * 1024) + '"}', content_type="application/json"
    )
    assert_error(response, 413, contains="larger")


def test_alice_cannot_start_a_run_with_bobs_script(alice_api, alice_assets, bob, enqueued):
    from artweb.testing.factories import RolloutScriptVersionFactory

    bobs = RolloutScriptVersionFactory(asset__owner=bob, asset__name="bob-script")
    for ref in ("bob-script", bobs.asset_id):
        body = assert_error(
            alice_api.post("/api/v1/runs/create/", create_payload(alice_assets, script=ref), format="json"),
            400,
            field="script",
        )
        assert body["field_errors"]["script"] == ["not found"]
    assert not Run.objects.exists()


def test_it_throttles_run_creation(alice_api, alice_assets, enqueued, api_settings):
    api_settings.REST_FRAMEWORK = {**api_settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"runs": "2/min"}}
    for i in range(2):
        assert (
            alice_api.post(
                "/api/v1/runs/create/", create_payload(alice_assets, name=f"r{i}"), format="json"
            ).status_code
            == 201
        )
    response = alice_api.post("/api/v1/runs/create/", create_payload(alice_assets, name="r3"), format="json")
    assert_error(response, 429, contains="try again")
    assert response["Retry-After"]
    assert Run.objects.count() == 2


# --- lifecycle -----------------------------------------------------------------------------------------


def test_it_cancels_a_queued_run(alice_api, alice):
    run = RunFactory(owner=alice)
    response = alice_api.post(f"/api/v1/runs/{run.id}/cancel/")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    assert_error(alice_api.post(f"/api/v1/runs/{run.id}/cancel/"), 400, contains="already cancelled")


def test_it_flags_a_running_run_for_cancel(alice_api, alice):
    run = RunFactory(owner=alice, status=Run.Status.RUNNING)
    body = alice_api.post(f"/api/v1/runs/{run.id}/cancel/").json()
    assert body["status"] == "running" and body["cancel_requested"] is True


def test_it_pauses_resumes_and_retries(alice_api, alice, enqueued):
    run = RunFactory(owner=alice)
    assert alice_api.post(f"/api/v1/runs/{run.id}/pause/").json()["status"] == "paused"
    assert alice_api.post(f"/api/v1/runs/{run.id}/resume/").json()["status"] == "queued"
    enqueued.assert_called_once_with(args=(run.id,), kwargs={})
    assert_error(alice_api.post(f"/api/v1/runs/{run.id}/retry/"), 400, contains="failed or cancelled")
    Run.objects.filter(id=run.id).update(status=Run.Status.FAILED, error="boom")
    body = alice_api.post(f"/api/v1/runs/{run.id}/retry/").json()
    assert body["status"] == "queued" and body["error"] == ""


def test_bob_cannot_act_on_alices_run(bob_api, alice):
    run = RunFactory(owner=alice)
    for action in ("cancel", "pause", "resume", "retry"):
        assert_error(bob_api.post(f"/api/v1/runs/{run.id}/{action}/"), 404)
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED and not run.cancel_requested
    assert not RunEvent.objects.filter(run=run).exists()


# --- metrics, events, logs -----------------------------------------------------------------------------


def test_it_serves_metrics_series_since_a_cursor(alice_api, alice):
    run = RunFactory(owner=alice, num_steps=10)
    Step.objects.bulk_create(
        [Step(run=run, step=i, reward_mean=i / 10, metrics={"loss": 1.0 / i}) for i in range(1, 11)]
    )
    body = alice_api.get(f"/api/v1/runs/{run.id}/metrics/?series=reward_mean,loss").json()
    assert set(body["series"]) == {"reward_mean", "loss"}
    assert body["series"]["reward_mean"]["x"] == list(range(1, 11))
    assert body["last_step"] == 10
    newer = alice_api.get(f"/api/v1/runs/{run.id}/metrics/?series=reward_mean&since_step=8").json()
    assert newer["series"]["reward_mean"]["x"] == [9, 10]
    nothing = alice_api.get(f"/api/v1/runs/{run.id}/metrics/?since_step=10").json()
    assert nothing["last_step"] == 10 and nothing["series"]["reward_mean"]["x"] == []


def test_it_downsamples_metrics_keeping_spikes(alice_api, alice):
    run = RunFactory(owner=alice, num_steps=2000)
    Step.objects.bulk_create([Step(run=run, step=i, reward_mean=(9.0 if i == 1234 else 0.5)) for i in range(1, 2001)])
    body = alice_api.get(f"/api/v1/runs/{run.id}/metrics/?series=reward_mean&max_points=100").json()
    points = body["series"]["reward_mean"]
    assert len(points["x"]) <= 100 and 1234 in points["x"] and 9.0 in points["y"]


@pytest.mark.parametrize(
    "query, field",
    [
        ("series=reward%3Bdrop", "series"),
        ("since_step=-1", "since_step"),
        ("max_points=abc", "max_points"),
        ("since_step=99999999999", "since_step"),
    ],
)
def test_it_rejects_bad_metrics_queries(alice_api, alice, query, field):
    run = RunFactory(owner=alice)
    assert_error(alice_api.get(f"/api/v1/runs/{run.id}/metrics/?{query}"), 400, field=field)


def test_it_pages_events_and_logs_after_a_cursor(alice_api, alice):
    run = RunFactory(owner=alice)
    events = [RunEvent.objects.create(run=run, kind="status", message=f"e{i}") for i in range(3)]
    page = alice_api.get(f"/api/v1/runs/{run.id}/events/?limit=2").json()
    assert [e["message"] for e in page["results"]] == ["e0", "e1"]
    rest = alice_api.get(f"/api/v1/runs/{run.id}/events/?after={page['next_after']}").json()
    assert [e["id"] for e in rest["results"]] == [events[2].id]
    RunLog.objects.create(run=run, step=1, message="hello")
    logs = alice_api.get(f"/api/v1/runs/{run.id}/logs/").json()
    assert [entry["message"] for entry in logs["results"]] == ["hello"]
    assert_error(alice_api.get(f"/api/v1/runs/{run.id}/events/?limit=0"), 400, field="limit")


def test_the_step_factory_still_works_with_metrics(alice_api, alice):
    step = StepFactory(run=RunFactory(owner=alice))
    body = alice_api.get(f"/api/v1/runs/{step.run_id}/metrics/?series=loss,kl").json()
    assert body["series"]["loss"]["y"] == [0.1]


def test_the_metrics_selector_takes_a_metrics_number_then_a_timings_number(alice):
    """One selector answers the metrics API, the compare page and the run page's first paint: a column as
    it is; else the metrics key when it is a number, the timings key when the metrics key is absent or
    null; anything else (a flag, a text) is no value."""
    from training.selectors import run_chart_data, run_metrics

    run = RunFactory(owner=alice)
    Step.objects.bulk_create(
        [
            Step(
                run=run,
                step=1,
                reward_mean=0.1,
                reward_std=0.05,
                metrics={"loss": 1.5, "flag": True, "note": "text"},
                timings={"train": 2.0, "note": 3.0},
            ),
            Step(
                run=run,
                step=2,
                reward_mean=None,
                val_reward=0.7,
                metrics={"loss": None, "tokens": 12},
                timings={"loss": 9.0},
            ),
            Step(run=run, step=3, reward_mean=0.3, metrics={}, timings={}),
        ]
    )
    names = ["reward_mean", "val_reward", "loss", "flag", "note", "train", "tokens", "absent", "loss"]

    def points(**series):
        return {n: {"x": [p[0] for p in series.get(n, [])], "y": [p[1] for p in series.get(n, [])]} for n in names}

    assert run_metrics(run=run, series=names) == {
        "series": points(
            reward_mean=[(1, 0.1), (3, 0.3)],
            val_reward=[(2, 0.7)],
            loss=[(1, 1.5), (2, 9.0)],
            train=[(1, 2.0)],
            tokens=[(2, 12.0)],
        ),
        "last_step": 3,
    }
    assert run_metrics(run=run, series=names, since_step=1) == {
        "series": points(reward_mean=[(3, 0.3)], val_reward=[(2, 0.7)], loss=[(2, 9.0)], tokens=[(2, 12.0)]),
        "last_step": 3,
    }
    assert run_metrics(run=run, series=names, since_step=3) == {"series": points(), "last_step": 3}
    chart = run_chart_data(run=run)
    assert chart["series"]["reward_mean"] == run_metrics(run=run, series=["reward_mean"])["series"]["reward_mean"]
    assert chart["series"]["reward_band"] == {"x": [1, 3], "std": [0.05, None]}
    assert chart["last_step"] == 3


def test_it_names_the_accepted_content_types_and_methods(alice_api):
    body = assert_error(alice_api.post("/api/v1/runs/create/", "name=x", content_type="text/plain"), 415)
    assert "application/json" in body["message"]
    assert_error(alice_api.get("/api/v1/runs/create/"), 405, contains="not allowed")
