"""What a dry run's page says it waits for: no worker, a busy worker, or its worker's stage."""

from __future__ import annotations

import pytest
import redis
from django.conf import settings
from django.urls import reverse

from artweb.testing.factories import BaseModelFactory, RolloutScriptVersionFactory, RunFactory
from training.jobs.services import job_event
from training.models import DryRun, Run
from training.services.dry_runs import DRY_RUN_JOBS, dry_run_waiting
from training.sweeper import ALIVE_PREFIX, worker_mark


@pytest.fixture
def marks():
    client = redis.Redis.from_url(settings.REDIS_URL)
    for key in client.scan_iter(match=f"{ALIVE_PREFIX}*"):
        client.delete(key)
    yield client
    for key in client.scan_iter(match=f"{ALIVE_PREFIX}*"):
        client.delete(key)


@pytest.fixture
def dry(alice):
    return DryRun.objects.create(
        owner=alice,
        script_version=RolloutScriptVersionFactory(asset__owner=alice),
        base_model=BaseModelFactory(name="tiny"),
        scenarios=[{"prompt": "hi"}],
        samples=2,
    )


def test_with_no_gpu_worker_it_says_so_and_how_to_start_one(dry, marks, client, alice):
    worker_mark(marks, "default-1@host", "default")  # a default-queue worker cannot take it
    assert dry_run_waiting(dry).startswith("No GPU worker is running")
    client.force_login(alice)
    status = client.get(reverse("dry-run-status", args=[dry.id])).json()
    assert status["finished"] is False and status["waiting"].startswith("No GPU worker is running")
    page = client.get(reverse("dry-run-detail", args=[dry.id])).content.decode()
    assert "No GPU worker is running" in page


def test_a_free_or_busy_gpu_worker(dry, marks):
    worker_mark(marks, "gpu-1@host", "gpu")
    assert dry_run_waiting(dry) == "Queued: a worker takes it in a moment."
    RunFactory(status=Run.Status.RUNNING, worker="gpu-1@host:12")
    assert dry_run_waiting(dry) == "Queued: the worker is busy with a training step and takes it next."


def test_a_running_dry_run_says_its_stage_and_for_how_long(dry, marks, client, alice):
    DryRun.objects.filter(id=dry.id).update(status="running")
    dry.refresh_from_db()
    assert dry_run_waiting(dry) == "A worker took it and is starting."
    job_event(jobs=DRY_RUN_JOBS, job=dry, kind="stage", message="Starting the inference server for tiny.")
    assert dry_run_waiting(dry) == "Starting the inference server for tiny. (0 s so far)"
    client.force_login(alice)
    assert client.get(reverse("dry-run-status", args=[dry.id])).json()["waiting"].startswith("Starting the inference")
    DryRun.objects.filter(id=dry.id).update(status="done")
    assert client.get(reverse("dry-run-status", args=[dry.id])).json() == {
        "id": dry.id,
        "status": "done",
        "finished": True,
        "waiting": "",
    }
