"""Recovery that runs by itself: a broker that is down when a run, dry run or serve job is created costs
the request nothing (201, the row saved and queued), and the sweep that every worker runs sends the owed
message once the broker is back; the sweeper thread requeues a run whose worker stopped heartbeating without anyone
calling it. The broker is the real Redis the tests use; "down" is a port where nothing listens."""

import json
import time
from contextlib import contextmanager
from datetime import timedelta
from unittest import mock

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from artweb.celery import app
from artweb.testing.factories import (
    BaseModelFactory,
    RewardFunctionVersionFactory,
    RolloutScriptVersionFactory,
    RunFactory,
    ScenarioSetFactory,
)
from tests.api.conftest import token_client
from training.models import DryRun, Run
from training.sweeper import Sweeper, dispatch_owed

pytestmark = pytest.mark.django_db(transaction=True)  # the messages leave on commit, as in production


def _reset_producers():
    """Drop every pooled connection and producer (the app's and kombu's process-wide registries, which
    other tests may have filled), so the next message connects to whatever broker_url says now."""
    from kombu import pools

    pools.reset()
    app._pool = None
    app.amqp._producer_pool = None


@contextmanager
def broker_unreachable():
    saved = {k: app.conf[k] for k in ("broker_url", "broker_connection_timeout", "task_publish_retry")}
    app.conf.update(broker_url="redis://127.0.0.1:1/0", broker_connection_timeout=1, task_publish_retry=False)
    _reset_producers()
    try:
        yield
    finally:
        app.conf.update(saved)
        _reset_producers()


@pytest.fixture
def broker_down():
    with broker_unreachable():
        yield


def _queued_messages(queue: str) -> list[dict]:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    return [json.loads(raw) for raw in client.lrange(queue, 0, -1)]


def _take_message(queue: str, task: str, obj_id: int) -> bool:
    """Remove our message from the queue (no worker runs here); True if it was there."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    for raw in client.lrange(queue, 0, -1):
        message = json.loads(raw)
        if message["headers"]["task"] == task and f"({obj_id}," in message["headers"]["argsrepr"]:
            client.lrem(queue, 1, raw)
            return True
    return False


def test_a_run_created_while_the_broker_is_down_is_saved_queued_and_sent_later(alice, broker_down):
    api = token_client(alice)
    payload = {
        "name": "offline",
        "base_model": BaseModelFactory().name,
        "script": RolloutScriptVersionFactory(asset__owner=alice, asset__name="s").asset.name,
        "reward": RewardFunctionVersionFactory(asset__owner=alice, asset__name="r").asset.name,
        "scenario_set": ScenarioSetFactory(owner=alice, name="sc").name,
    }
    response = api.post("/api/v1/runs/create/", payload, format="json")
    assert response.status_code == 201, response.content
    run = Run.objects.get(id=response.json()["id"])
    assert run.status == Run.Status.QUEUED and run.dispatched_at is None

    assert dispatch_owed()["runs"] == []  # too recent: its first message may still be on its way
    Run.objects.filter(id=run.id).update(created_at=timezone.now() - timedelta(minutes=1))
    assert dispatch_owed()["runs"] == []  # the broker is still down: still owed, nothing lost
    assert Run.objects.get(id=run.id).dispatched_at is None


def test_the_sweep_sends_what_is_owed_once_the_broker_is_back(alice):
    run = RunFactory(owner=alice, status=Run.Status.QUEUED, dispatched_at=None)
    dry = DryRun.objects.create(
        owner=alice,
        script_version=RolloutScriptVersionFactory(asset__owner=alice),
        base_model=BaseModelFactory(),
        scenarios=[{"prompt": "x"}],
    )
    old = timezone.now() - timedelta(minutes=1)
    Run.objects.filter(id=run.id).update(created_at=old)
    DryRun.objects.filter(id=dry.id).update(created_at=old)
    try:
        assert dispatch_owed() == {"runs": [run.id], "dry_runs": [dry.id], "rescores": [], "serve_jobs": []}
        assert Run.objects.get(id=run.id).dispatched_at is not None
        assert DryRun.objects.get(id=dry.id).dispatched_at is not None
        assert dispatch_owed() == {"runs": [], "dry_runs": [], "rescores": [], "serve_jobs": []}  # sent once
    finally:
        assert _take_message("gpu", "training.tasks.run_step_task", run.id)
        assert _take_message("gpu", "rollouts.tasks.dry_run_task", dry.id)


def test_a_serve_job_created_while_the_broker_is_down_is_sent_by_the_sweep(alice):
    from training.serving.models import ServeJob
    from training.serving.services.serve_jobs import playground_create

    with broker_unreachable():
        job = playground_create(user=alice, models=[BaseModelFactory().name], prompt="Say hi.")
        job.refresh_from_db()
        assert job.status == ServeJob.Status.QUEUED and job.dispatched_at is None  # saved, its message owed
        ServeJob.objects.filter(id=job.id).update(created_at=timezone.now() - timedelta(minutes=1))
        assert dispatch_owed()["serve_jobs"] == []  # still down: still owed, nothing lost
    try:
        assert dispatch_owed()["serve_jobs"] == [job.id]  # the broker is back
        assert ServeJob.objects.get(id=job.id).dispatched_at is not None
        assert dispatch_owed()["serve_jobs"] == []  # sent once
    finally:
        assert _take_message("default", "training.tasks.serve_job_execute_task", job.id)


def test_the_sweeper_thread_requeues_a_run_whose_worker_died_without_being_asked(alice, settings):
    settings.ARTWEB = {**settings.ARTWEB, "SWEEP_SECONDS": 0.3, "HEARTBEAT_SECONDS": 1}
    run = RunFactory(
        owner=alice,
        status=Run.Status.RUNNING,
        steps_done=2,
        worker="gone-host:1",
        heartbeat_at=timezone.now() - timedelta(minutes=5),
        dispatched_at=timezone.now(),
    )
    redis.Redis.from_url(settings.REDIS_URL).delete("artweb:sweep")
    with mock.patch.object(Sweeper, "_started", False):
        sweeper = Sweeper.start()
    try:
        deadline = time.monotonic() + 15
        while Run.objects.get(id=run.id).worker and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        sweeper.stop()
    assert Run.objects.get(id=run.id).worker == ""
    assert run.events.filter(kind="requeued").exists()
    assert _take_message("gpu", "training.tasks.run_step_task", run.id)


def test_each_workers_sweeper_marks_it_alive_idle_or_busy_and_the_mark_lapses(settings):
    from training.sweeper import ALIVE_PREFIX, workers_alive

    settings.ARTWEB = {**settings.ARTWEB, "SWEEP_SECONDS": 0.25}
    client = redis.Redis.from_url(settings.REDIS_URL)
    for key in client.scan_iter(match=f"{ALIVE_PREFIX}*"):
        client.delete(key)
    with mock.patch.object(Sweeper, "_started", False):
        sweeper = Sweeper.start(name="gpu-worker-1@host", queue="gpu")
    try:
        deadline = time.monotonic() + 5
        while not workers_alive(client) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert workers_alive(client) == {"gpu": 1}  # no run anywhere: alive while idle
    finally:
        sweeper.stop()
    deadline = time.monotonic() + 5  # four periods after its last mark, it is no longer counted
    while workers_alive(client) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert workers_alive(client) == {}


def test_a_run_waiting_its_turn_behind_others_is_not_requeued_while_its_turn_waits_on_the_broker(alice, bob):
    """Between steps a run has no worker, and behind other users' runs in the fair queue it may wait longer
    than a lease: while as many step messages wait on the broker as runs wait for a turn, nothing is lost and
    the sweep leaves it alone (no event, no extra message). With its message lost, the sweep requeues it."""
    from training.jobs.services import job_recover_stale
    from training.services.runs import RUN_JOBS

    old = timezone.now() - timedelta(minutes=10)
    waiting = RunFactory(owner=alice, status=Run.Status.RUNNING, steps_done=3, worker="", heartbeat_at=old)
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.delete("gpu")
    app.send_task("training.tasks.run_step_task", args=(waiting.id,), kwargs={"step": 4}, queue="gpu")
    try:
        assert job_recover_stale(jobs=RUN_JOBS) == []
        assert not waiting.events.filter(kind="requeued").exists()
        assert client.llen("gpu") == 1

        # A second run waits, and a broker that restarted empty lost the messages: both are requeued.
        other = RunFactory(owner=bob, status=Run.Status.QUEUED, worker="", heartbeat_at=old)
        Run.objects.filter(id=other.id).update(status=Run.Status.RUNNING)
        client.delete("gpu")
        assert sorted(job_recover_stale(jobs=RUN_JOBS)) == sorted([waiting.id, other.id])
        assert waiting.events.filter(kind="requeued").exists()
        assert _take_message("gpu", "training.tasks.run_step_task", waiting.id)
        assert _take_message("gpu", "training.tasks.run_step_task", other.id)
    finally:
        client.delete("gpu")
