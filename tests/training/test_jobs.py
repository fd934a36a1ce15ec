"""One job model (training.jobs): runs, dry runs, re-scores and serve jobs are claimed by a conditional update, finish
or fail once with an event row each, and the sweep recovers a stale one of every kind the same way: its
kind says whether it is queued again or failed."""

from datetime import timedelta

import pytest
from django.utils import timezone

from artweb.celery import app
from artweb.testing.factories import (
    BaseModelFactory,
    RewardFunctionVersionFactory,
    RolloutScriptVersionFactory,
    RunFactory,
)
from training.analytics.rescores import RESCORE_JOBS
from training.jobs.kinds import job_kinds
from training.jobs.services import job_claim, job_fail, job_finish
from training.models import DryRun, Rescore, Run
from training.services.dry_runs import DRY_RUN_JOBS
from training.serving.models import ServeJob
from training.sweeper import recover_stale


@pytest.fixture
def sent(monkeypatch):
    """Records the messages the sweep sends, by task name (no worker in these tests)."""
    from training import tasks

    calls = []
    from training.serving.tasks import serve_job_execute_task

    for task in (tasks.run_step_task, tasks.rescore_execute_task, tasks.dry_run_task, serve_job_execute_task):
        monkeypatch.setattr(task, "apply_async", lambda *a, _name=task.name, **k: calls.append((_name, k)))
    return calls


def _dry_run(owner, **fields) -> DryRun:
    dry = DryRun.objects.create(
        owner=owner,
        script_version=RolloutScriptVersionFactory(asset__owner=owner),
        base_model=BaseModelFactory(),
        scenarios=[{"prompt": "x"}],
    )
    DryRun.objects.filter(id=dry.id).update(**fields)
    return DryRun.objects.get(id=dry.id)


def _rescore(owner, **fields) -> Rescore:
    run = RunFactory(owner=owner, status=Run.Status.COMPLETED)
    rescore = Rescore.objects.create(
        owner=owner, run=run, reward_version=RewardFunctionVersionFactory(asset__owner=owner)
    )
    Rescore.objects.filter(id=rescore.id).update(**fields)
    return Rescore.objects.get(id=rescore.id)


def _stale() -> dict:
    return {"status": "running", "worker": "gone-host:1", "heartbeat_at": timezone.now() - timedelta(hours=1)}


def test_each_kind_sends_its_messages_to_the_queue_its_task_is_routed_to():
    assert {kind.name: kind.queue for kind in job_kinds()} == {
        "runs": "gpu",
        "dry_runs": "gpu",
        "rescores": "default",
        "serve_jobs": "default",
    }
    for kind in job_kinds():
        assert app.amqp.router.route({}, kind.task)["queue"].name == kind.queue


def test_it_claims_a_queued_job_once_and_records_who_took_it(alice):
    dry = _dry_run(alice)
    assert job_claim(jobs=DRY_RUN_JOBS, job_id=dry.id, me="host-a:1")
    assert not job_claim(jobs=DRY_RUN_JOBS, job_id=dry.id, me="host-b:2")  # a duplicate delivery does nothing
    dry.refresh_from_db()
    assert (dry.status, dry.worker) == ("running", "host-a:1")
    assert dry.heartbeat_at is not None and dry.started_at is not None
    event = dry.events.get()
    assert (event.kind, event.data, event.worker) == ("status", {"from": "queued", "to": "running"}, "host-a:1")


def test_a_running_job_is_claimed_only_when_its_worker_is_gone(alice):
    rescore = _rescore(alice, status="running", worker="host-a:1", heartbeat_at=timezone.now())
    assert not job_claim(jobs=RESCORE_JOBS, job_id=rescore.id, me="host-b:2")  # held: its worker heartbeats
    Rescore.objects.filter(id=rescore.id).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    assert job_claim(jobs=RESCORE_JOBS, job_id=rescore.id, me="host-b:2")
    assert Rescore.objects.get(id=rescore.id).worker == "host-b:2"
    assert not rescore.events.exists()  # the status did not change: no event
    Rescore.objects.filter(id=rescore.id).update(status="done")
    assert not job_claim(jobs=RESCORE_JOBS, job_id=rescore.id, me="host-b:2")  # finished: never again


def test_it_finishes_or_fails_a_job_once_with_an_event_each(alice):
    done, failed = _dry_run(alice), _dry_run(alice)
    for dry in (done, failed):
        assert job_claim(jobs=DRY_RUN_JOBS, job_id=dry.id, me="host-a:1")
        dry.refresh_from_db()
    assert job_finish(jobs=DRY_RUN_JOBS, job=done, result={"trajectories": []})
    assert not job_fail(jobs=DRY_RUN_JOBS, job=done, error="too late")  # done stays done
    assert job_fail(jobs=DRY_RUN_JOBS, job=failed, error="RuntimeError: boom")
    assert not job_finish(jobs=DRY_RUN_JOBS, job=failed, result={})
    done.refresh_from_db()
    failed.refresh_from_db()
    assert (done.status, done.result, done.worker, done.error) == ("done", {"trajectories": []}, "", "")
    assert (failed.status, failed.error, failed.worker) == ("failed", "RuntimeError: boom", "")
    assert done.finished_at is not None and failed.finished_at is not None
    assert [e.data["to"] for e in done.events.all()] == ["running", "done"]
    assert [e.data["to"] for e in failed.events.all()] == ["running", "failed"]
    assert failed.events.last().message == "Failed: RuntimeError: boom"


def test_the_sweep_requeues_a_stale_run_at_the_step_it_owes(alice, sent, django_capture_on_commit_callbacks):
    run = RunFactory(owner=alice, steps_done=2, **_stale())
    with django_capture_on_commit_callbacks(execute=True):
        assert recover_stale()["runs"] == [run.id]
    run.refresh_from_db()
    assert (run.status, run.worker) == ("running", "")
    assert sent == [("training.tasks.run_step_task", {"args": (run.id,), "kwargs": {"step": 3}})]
    assert run.events.get(kind="requeued").worker == "gone-host:1"


def test_the_sweep_fails_a_stale_dry_run_with_a_message(alice, sent, django_capture_on_commit_callbacks):
    dry = _dry_run(alice, **_stale())
    with django_capture_on_commit_callbacks(execute=True):
        assert recover_stale()["dry_runs"] == [dry.id]
        assert recover_stale()["dry_runs"] == []  # once
    dry.refresh_from_db()
    assert (dry.status, dry.worker) == ("failed", "")
    assert dry.error == "Its worker gone-host:1 stopped heartbeating, so it was stopped; start it again."
    event = dry.events.get(kind="status")
    assert (event.data, event.worker) == ({"from": "running", "to": "failed"}, "gone-host:1")
    assert sent == []  # a dry run is not taken up half-way


def test_the_sweep_requeues_a_stale_rescore_and_a_new_worker_goes_on(alice, sent, django_capture_on_commit_callbacks):
    rescore = _rescore(alice, **_stale())
    with django_capture_on_commit_callbacks(execute=True):
        assert recover_stale()["rescores"] == [rescore.id]
        assert recover_stale()["rescores"] == []  # the requeue counts as activity
    rescore.refresh_from_db()
    assert (rescore.status, rescore.worker) == ("running", "")
    assert sent == [("training.tasks.rescore_execute_task", {"args": (rescore.id,), "kwargs": {}})]
    assert rescore.events.get(kind="requeued").message == "Worker gone-host:1 stopped heartbeating; queued it again."
    assert job_claim(jobs=RESCORE_JOBS, job_id=rescore.id, me="host-b:2")  # the message's worker takes it over


def test_the_sweep_requeues_a_stale_serve_job(alice, sent, django_capture_on_commit_callbacks):
    job = ServeJob.objects.create(owner=alice, kind=ServeJob.Kind.DIFF, model_names=["a", "b"])
    ServeJob.objects.filter(id=job.id).update(**_stale())
    with django_capture_on_commit_callbacks(execute=True):
        assert recover_stale()["serve_jobs"] == [job.id]
    job.refresh_from_db()
    assert (job.status, job.worker) == ("running", "")
    assert sent == [("training.tasks.serve_job_execute_task", {"args": (job.id,), "kwargs": {}})]
    assert job.events.get(kind="requeued").worker == "gone-host:1"


def test_the_sweep_leaves_live_queued_and_finished_jobs_alone(alice, sent, django_capture_on_commit_callbacks):
    live = {"status": "running", "worker": "host-a:1", "heartbeat_at": timezone.now()}
    RunFactory(owner=alice, **live)
    _dry_run(alice, **live)
    _rescore(alice, **live)
    _dry_run(alice)  # queued: its message is the sweep's other half (dispatch_owed)
    _rescore(alice, **{**_stale(), "status": "done"})
    with django_capture_on_commit_callbacks(execute=True):
        assert recover_stale() == {"runs": [], "dry_runs": [], "rescores": [], "serve_jobs": []}
    assert sent == []
