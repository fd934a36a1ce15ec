"""Dry runs: queued for a GPU worker, polled; ownership of everything they name."""

from unittest import mock

import pytest

from artweb.testing.factories import RolloutScriptVersionFactory
from tests.api.conftest import assert_error
from training.models import DryRun

pytestmark = pytest.mark.django_db


@pytest.fixture
def enqueued():
    """dry_run_create queues dry_run_task after commit for a GPU worker; none runs in API tests, so the
    queueing call is replaced and recorded."""
    with (
        mock.patch("artweb.dispatch.transaction.on_commit", side_effect=lambda send: send()),
        mock.patch("training.tasks.dry_run_task.apply_async") as send,
    ):
        yield send


def test_it_queues_a_dry_run_and_polls_it(alice_api, alice_assets, enqueued):
    response = alice_api.post(
        "/api/v1/dry-runs/create/",
        {
            "script": "alice-script",
            "reward": "alice-reward",
            "base_model": alice_assets["base_model"].id,
            "scenario_set": "alice-scenarios",
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    enqueued.assert_called_once_with(args=(body["id"],), kwargs={})
    assert body["status"] == "queued" and len(body["scenarios"]) == 4
    DryRun.objects.filter(id=body["id"]).update(status="done", result={"trajectories": []})
    polled = alice_api.get(f"/api/v1/dry-runs/{body['id']}/").json()
    assert polled["status"] == "done" and polled["result"] == {"trajectories": []}


def test_it_takes_given_scenarios(alice_api, alice_assets, enqueued):
    body = alice_api.post(
        "/api/v1/dry-runs/create/",
        {
            "script": alice_assets["script"].asset_id,
            "base_model": alice_assets["base_model"].name,
            "scenarios": [{"prompt": "hi"}],
        },
        format="json",
    ).json()
    assert body["scenarios"] == [{"prompt": "hi"}] and body["reward"] is None


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"scenarios": []}, "scenarios"),
        ({"scenarios": [1]}, "scenarios"),
        ({"scenarios": [{}] * 9}, "scenarios"),
        ({}, "scenario_set"),
        ({"scenario_set": "nope"}, "scenario_set"),
        ({"script": "bob-script", "scenarios": [{"a": 1}]}, "script"),
    ],
)
def test_it_rejects_bad_dry_runs(alice_api, alice_assets, bob, enqueued, payload, field):
    RolloutScriptVersionFactory(asset__owner=bob, asset__name="bob-script")
    full = {"script": "alice-script", "base_model": alice_assets["base_model"].id, **payload}
    assert_error(alice_api.post("/api/v1/dry-runs/create/", full, format="json"), 400, field=field)
    assert not DryRun.objects.exists()
    enqueued.assert_not_called()


def test_bob_cannot_poll_alices_dry_run(bob_api, alice_api, alice_assets, enqueued):
    body = alice_api.post(
        "/api/v1/dry-runs/create/",
        {"script": "alice-script", "base_model": alice_assets["base_model"].id, "scenarios": [{"secret": 1}]},
        format="json",
    ).json()
    response = bob_api.get(f"/api/v1/dry-runs/{body['id']}/")
    assert_error(response, 404)
    assert "secret" not in response.content.decode()
