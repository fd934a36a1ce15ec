"""The quota API, and the 400 that launching past the runs-at-once limit gets."""

import pytest

from artweb.testing.factories import RunFactory
from tests.api.conftest import assert_error
from training.models import Quota, Run


@pytest.fixture
def enqueued(monkeypatch):
    from training import tasks

    calls = []
    monkeypatch.setattr(tasks.run_step_task, "apply_async", lambda args, kwargs: calls.append((args, kwargs)))
    return calls


def test_it_shows_your_usage_against_each_limit(alice_api, alice, bob, settings):
    settings.ARTWEB_QUOTA_STEPS_PER_DAY = 0
    RunFactory(owner=alice, status=Run.Status.RUNNING, trajectory_bytes=1234)
    RunFactory(owner=bob, status=Run.Status.RUNNING, trajectory_bytes=999_999)  # not hers
    Quota.objects.create(user=alice, concurrent_runs=1)
    response = alice_api.get("/api/v1/quota/")
    assert response.status_code == 200
    assert response.json() == {
        "quotas": [
            {
                "key": "trajectory_bytes",
                "label": "Stored trajectories",
                "used": 1234,
                "limit": 10240 << 20,
                "reached": False,
                "source": "the default",
            },
            {
                "key": "concurrent_runs",
                "label": "Runs queued or running",
                "used": 1,
                "limit": 1,
                "reached": True,
                "source": "your own quota",
            },
            {
                "key": "steps_per_day",
                "label": "Training steps in the last 24 hours",
                "used": 0,
                "limit": None,
                "reached": False,
                "source": "the default",
            },
            {
                "key": "gpu_seconds",
                "label": "GPU hours in the last 24 hours",
                "used": 0,
                "limit": None,
                "reached": False,
                "source": "the default",
            },
            {
                "key": "attachment_bytes",
                "label": "Data attachments",
                "used": 0,
                "limit": 10240 << 20,
                "reached": False,
                "source": "the default",
            },
        ]
    }


def test_it_needs_a_signed_in_user(anon_api):
    assert anon_api.get("/api/v1/quota/").status_code in (401, 403)


def test_creating_a_run_past_the_runs_at_once_limit_is_a_400_naming_it(alice_api, alice, alice_assets, enqueued):
    Quota.objects.create(user=alice, concurrent_runs=1)
    RunFactory(owner=alice, status=Run.Status.QUEUED)
    response = alice_api.post(
        "/api/v1/runs/create/",
        {
            "name": "r",
            "base_model": alice_assets["base_model"].name,
            "script": "alice-script",
            "reward": "alice-reward",
            "scenario_set": "alice-scenarios",
            "config": {"num_steps": 2},
        },
        format="json",
    )
    body = assert_error(response, 400, field="quota", contains="the limit of your quota (1 at once, your own quota)")
    assert body["field_errors"] == {"quota": ["concurrent_runs"]}
    assert enqueued == [] and Run.objects.filter(owner=alice).count() == 1
