"""The stale-run sweep (the beat task every 10 s): runs nobody works on are queued again, exactly once."""

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.factories import RunFactory
from training.models import Run
from training.services.steps import runs_requeue_stale

S = Run.Status


@pytest.fixture
def sent(monkeypatch):
    """Records the step messages the sweep sends (no worker in these tests)."""
    calls = []
    from training import tasks

    monkeypatch.setattr(tasks.run_step_task, "apply_async", lambda *a, **k: calls.append(k))
    return calls


def test_it_requeues_a_run_whose_worker_stopped_heartbeating(alice, sent, django_capture_on_commit_callbacks):
    run = RunFactory(owner=alice, status=S.RUNNING, steps_done=2, worker="host:1",
                     heartbeat_at=timezone.now() - timedelta(minutes=5))
    with django_capture_on_commit_callbacks(execute=True):
        assert runs_requeue_stale() == [run.id]
    run.refresh_from_db()
    assert run.worker == "" and run.status == S.RUNNING
    assert sent == [{"args": [run.id], "kwargs": {"step": 3}}]
    event = run.events.get(kind="requeued")
    assert "host:1 stopped heartbeating" in event.message and event.data["steps_done"] == 2


def test_it_requeues_a_run_left_between_steps_by_a_dead_worker(alice, sent, django_capture_on_commit_callbacks):
    # The worker released step 2's lease and died holding step 3's message, before claiming it.
    run = RunFactory(owner=alice, status=S.RUNNING, steps_done=2, worker="",
                     heartbeat_at=timezone.now() - timedelta(minutes=5))
    with django_capture_on_commit_callbacks(execute=True):
        assert runs_requeue_stale() == [run.id]
        # The requeue counts as activity: the next sweep leaves it alone for another stale period.
        assert runs_requeue_stale() == []
    assert sent == [{"args": [run.id], "kwargs": {"step": 3}}]
    assert run.events.get(kind="requeued").message == "No worker took step 3; queued it again."


def test_it_leaves_live_paused_and_finished_runs_alone(alice, sent, django_capture_on_commit_callbacks):
    old = timezone.now() - timedelta(minutes=5)
    RunFactory(owner=alice, status=S.RUNNING, worker="host:1", heartbeat_at=timezone.now())
    RunFactory(owner=alice, status=S.RUNNING, worker="", heartbeat_at=timezone.now())
    RunFactory(owner=alice, status=S.PAUSED, worker="", heartbeat_at=old)
    RunFactory(owner=alice, status=S.COMPLETED, worker="", heartbeat_at=old)
    RunFactory(owner=alice, status=S.QUEUED, worker="")
    with django_capture_on_commit_callbacks(execute=True):
        assert runs_requeue_stale() == []
    assert sent == []
