"""The stale-run sweep that every worker runs: runs nobody works on are queued again, exactly once."""

from datetime import timedelta

import pytest
from django.utils import timezone

from artweb.testing.factories import RunFactory
from training.models import Run
from training.services.steps import runs_requeue_stale


@pytest.fixture
def sent(monkeypatch):
    """Records the step messages the sweep sends (no worker in these tests)."""
    calls = []
    from training import tasks

    monkeypatch.setattr(tasks.run_step_task, "apply_async", lambda *a, **k: calls.append(k))
    return calls


def test_it_requeues_a_run_whose_worker_stopped_heartbeating(alice, sent, django_capture_on_commit_callbacks):
    run = RunFactory(
        owner=alice,
        status=Run.Status.RUNNING,
        steps_done=2,
        worker="host:1",
        heartbeat_at=timezone.now() - timedelta(minutes=5),
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert runs_requeue_stale() == [run.id]
    run.refresh_from_db()
    assert run.worker == "" and run.status == Run.Status.RUNNING
    assert sent == [{"args": (run.id,), "kwargs": {"step": 3}}]
    event = run.events.get(kind="requeued")
    assert "host:1 stopped heartbeating" in event.message and event.data["steps_done"] == 2


def test_it_requeues_a_run_left_between_steps_by_a_dead_worker(
    alice, sent, django_capture_on_commit_callbacks, empty_gpu_queue
):
    # The worker released step 2's lease and died holding step 3's message, before claiming it: no step
    # message waits on the broker for the run's turn (tests/training/test_sweeper.py has the case where one does).
    run = RunFactory(
        owner=alice,
        status=Run.Status.RUNNING,
        steps_done=2,
        worker="",
        heartbeat_at=timezone.now() - timedelta(minutes=5),
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert runs_requeue_stale() == [run.id]
        # The requeue counts as activity: the next sweep leaves it alone for another stale period.
        assert runs_requeue_stale() == []
    assert sent == [{"args": (run.id,), "kwargs": {"step": 3}}]
    assert run.events.get(kind="requeued").message == "No worker took step 3; queued it again."


@pytest.fixture
def empty_gpu_queue(settings):
    """The broker's gpu queue with no message in it (earlier tests may have left some: no worker runs here)."""
    import redis

    from artweb.dispatch import PRIORITY_SEP, PRIORITY_STEPS, waiting_messages

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.delete(*("gpu" if p == 0 else f"gpu{PRIORITY_SEP}{p}" for p in PRIORITY_STEPS))
    assert waiting_messages("gpu") == 0
    yield


def test_it_leaves_live_paused_and_finished_runs_alone(alice, sent, django_capture_on_commit_callbacks):
    old = timezone.now() - timedelta(minutes=5)
    RunFactory(owner=alice, status=Run.Status.RUNNING, worker="host:1", heartbeat_at=timezone.now())
    RunFactory(owner=alice, status=Run.Status.RUNNING, worker="", heartbeat_at=timezone.now())
    RunFactory(owner=alice, status=Run.Status.PAUSED, worker="", heartbeat_at=old)
    RunFactory(owner=alice, status=Run.Status.COMPLETED, worker="", heartbeat_at=old)
    RunFactory(owner=alice, status=Run.Status.QUEUED, worker="")
    with django_capture_on_commit_callbacks(execute=True):
        assert runs_requeue_stale() == []
    assert sent == []


def test_a_pool_child_takes_over_the_step_of_a_dead_sibling_at_once(alice):
    """A prefork child killed mid-step: its message comes back to a new child while the dead one's
    heartbeat is still fresh. A process of this host that no longer exists holds nothing."""
    import socket
    import subprocess
    import sys

    from django.utils import timezone

    from training.services.steps import run_claim

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        host = socket.gethostname()
        run = RunFactory(
            owner=alice, status=Run.Status.RUNNING, worker=f"{host}:{alive.pid}", heartbeat_at=timezone.now()
        )
        assert not run_claim(run_id=run.id, me=f"{host}:999999")  # a live holder keeps it
        Run.objects.filter(id=run.id).update(worker=f"other-host:{dead.pid}")
        assert not run_claim(run_id=run.id, me=f"{host}:999999")  # another host's process: only by staleness
        Run.objects.filter(id=run.id).update(worker=f"{host}:{dead.pid}")
        assert run_claim(run_id=run.id, me=f"{host}:999999")
        assert Run.objects.get(id=run.id).worker == f"{host}:999999"
    finally:
        alive.kill()
        alive.wait()
