"""A failing export never fails or slows a run: the step loop's hooks only enqueue, failures are retried
with backoff on the default queue, recorded on the target and the run's timeline, and change nothing else."""

import time

import pytest
from django.db import transaction

from artweb.launcher.embedded import free_port
from tests.egress import egress_allow
from training.exports import hooks
from training.exports.services import export_target_create
from training.exports.tasks import export_sync_task, run_exports_task
from training.models import ExportProgress, ExportTarget, Run, RunEvent, Step


def _result(run: Run) -> dict:
    """Everything a run's outcome consists of."""
    run.refresh_from_db()
    return {
        "run": (run.status, run.steps_done, run.latest_reward, run.best_val_reward, run.error, run.finished_at),
        "steps": list(Step.objects.filter(run=run).values_list("step", "reward_mean", "val_reward", "metrics")),
        "trajectories": list(run.trajectories.order_by("id").values_list("id", "reward", "advantage")),
        "checkpoints": list(run.checkpoints.values_list("step", "state")),
    }


@pytest.fixture
def enqueued(monkeypatch):
    calls = []
    monkeypatch.setattr(run_exports_task, "apply_async", lambda *a, **kw: calls.append((a, kw)))
    return calls


def test_the_hooks_enqueue_on_the_default_queue_after_commit(
    run_with_steps, enqueued, django_capture_on_commit_callbacks
):
    run = run_with_steps
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        transaction.on_commit(lambda: hooks.step_committed(run_id=run.id, step=2))
        assert enqueued == []  # nothing before the commit
    hooks.run_finished(run_id=run.id)
    assert [(kw["args"], kw["queue"], kw["kwargs"]) for _, kw in enqueued] == [
        ([run.id], "default", {"reason": "step", "step": 2}),
        ([run.id], "default", {"reason": "finished", "step": None}),
    ]


def test_the_hooks_never_raise_and_return_at_once_when_the_broker_is_down(run_with_steps):
    from artweb.celery import app

    old = app.conf.broker_url
    app.conf.broker_url = f"redis://127.0.0.1:{free_port()}/0"
    app.pool.force_close_all()
    app._pool = None
    app.amqp._producer_pool = None  # built on the pool just closed; dropped so the next send builds anew
    try:
        started = time.perf_counter()
        hooks.step_committed(run_id=run_with_steps.id, step=2)
        hooks.run_finished(run_id=run_with_steps.id)
        assert time.perf_counter() - started < 5.0
    finally:
        app.conf.broker_url = old
        app.pool.force_close_all()
        app._pool = None
        app.amqp._producer_pool = None


def test_the_fan_out_sends_one_task_per_enabled_target(run_with_steps, monkeypatch):
    run = run_with_steps
    wb = export_target_create(owner=run.owner, kind="wandb", settings={"project": "p"})
    lf = export_target_create(owner=run.owner, kind="langfuse", run=run)
    export_target_create(owner=run.owner, kind="weave", settings={"project": "e/p"})  # nothing to push
    sent = []
    monkeypatch.setattr(export_sync_task, "apply_async", lambda *a, **kw: sent.append((kw["args"], kw["queue"])))
    run_exports_task.apply(args=[run.id])
    assert sorted(sent) == sorted([([wb.id, run.id], "default"), ([lf.id, run.id], "default")])


def test_the_task_retries_with_backoff(run_with_steps):
    opts = export_sync_task
    assert opts.autoretry_for and opts.retry_backoff and opts.retry_jitter and opts.max_retries >= 5
    assert opts.retry_backoff_max >= 600


@pytest.mark.slow  # about 10 s: W&B's client waits out its start timeout on each attempt
def test_a_failing_exporter_does_not_change_the_runs_result(run_with_steps, monkeypatch, settings):
    """Both exporters fail every attempt (Langfuse: nothing listening; W&B: a server that never answers);
    the whole retry chain runs (eagerly, so without the backoff waits) and the run comes out the same."""
    import training.exports.wandb as wandb_export

    monkeypatch.setattr(wandb_export, "INIT_TIMEOUT_S", 3.0)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run = run_with_steps
    run.status = Run.Status.COMPLETED
    run.save(update_fields=["status"])
    before = _result(run)

    dead = egress_allow(settings, f"http://127.0.0.1:{free_port()}")
    lf = export_target_create(
        owner=run.owner, kind="langfuse", secret="sk-lf-secret-1234", settings={"host": dead, "public_key": "pk"}
    )
    wb = export_target_create(
        owner=run.owner, kind="wandb", secret="x" * 40, settings={"project": "p", "base_url": dead}
    )
    export_sync_task.max_retries, saved = 2, export_sync_task.max_retries
    try:
        for target in (lf, wb):
            outcome = export_sync_task.apply(args=[target.id, run.id])
            assert outcome.failed()
    finally:
        export_sync_task.max_retries = saved

    assert _result(run) == before
    for target in (lf, wb):
        target.refresh_from_db()
        assert target.last_error and target.last_error_at
        progress = ExportProgress.objects.get(target=target, run=run)
        assert progress.failures == 3 and progress.last_step == 0 and not progress.finished
    kinds = list(RunEvent.objects.filter(run=run, kind="export_warning").values_list("data__kind", flat=True))
    assert sorted(kinds) == ["langfuse", "wandb"]


def test_a_deleted_target_or_run_is_a_no_op(run_with_steps):
    from training.exports.services import export_sync

    target = export_target_create(owner=run_with_steps.owner, kind="langfuse")
    assert export_sync(target_id=target.id + 1000, run_id=run_with_steps.id) == 0
    assert export_sync(target_id=target.id, run_id=run_with_steps.id + 1000) == 0
    ExportTarget.objects.filter(id=target.id).update(enabled=False)
    assert export_sync(target_id=target.id, run_id=run_with_steps.id) == 0
