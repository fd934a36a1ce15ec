"""The run page's and the runs list's figures have one builder each (training.services.broadcast): the
first paint, the live messages after a step, a status change or a checkpoint's event, and a
reconnecting page's catch-up carry the same values. Real PostgreSQL, the real Redis channel layer and
the real ASGI application; the checkpoints' files are a temporary directory.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from artweb.testing.factories import CheckpointFactory, RunFactory, StepFactory
from tests.training.test_consumers import _connect
from training.charts import DEFAULT_SERIES
from training.models import Checkpoint, Run
from training.selectors import run_chart_data
from training.services import run_transition
from training.services.broadcast import (
    figures_send,
    run_group_name,
    run_row_message,
    runs_user_group,
    step_message,
    step_series,
)
from training.services.checkpoints import checkpoint_delete
from training.services.steps.commit import step_commit


@pytest.fixture
def listen():
    """listen(group) -> drain(): the messages the group received, read from the real channel layer."""
    layer = get_channel_layer()
    joined = []

    def join(group: str):
        channel = f"tests-figures-{time.monotonic_ns()}"
        async_to_sync(layer.group_add)(group, channel)
        joined.append((group, channel))

        async def drain():
            out = []
            while True:
                try:
                    out.append((await asyncio.wait_for(layer.receive(channel), 0.5))["message"])
                except TimeoutError:
                    return out

        return lambda: async_to_sync(drain)()

    yield join
    for group, channel in joined:
        async_to_sync(layer.group_discard)(group, channel)


def first_paint(client, run: Run) -> dict:
    """The run page's context as the view renders it."""
    return client.get(reverse("run-detail", args=[run.id])).context


def list_row(client, run: Run) -> dict:
    (row,) = [r for r in client.get(reverse("run-list")).context["rows"] if r["run"] == run.id]
    return row


@pytest.mark.django_db
def test_a_steps_points_live_are_the_first_paints():
    """The live rule (step_series) and the first paint's query pick the same value of each series: a
    column, a metrics number, a timings number when metrics has none, nothing for a text or a boolean."""
    run = RunFactory(num_steps=3, steps_done=3)
    steps = [
        StepFactory(
            run=run,
            step=1,
            reward_mean=0.25,
            reward_std=0.1,
            val_reward=0.5,
            duration_s=3.0,
            metrics={"loss": 0.5, "kl": 0.01, "effective_batch": 6, "entropy": 1.0 / 3},
            timings={"step": 3.0, "tokens_per_second": 800.0},
        ),
        StepFactory(
            run=run,
            step=2,
            reward_mean=0.5,
            reward_std=0.2,
            duration_s=2.5,
            metrics={"loss": "n/a", "kl": True, "tokens_per_second": None, "grad_norm": 1.5},
            timings={"step": 2.5, "tokens_per_second": 900.0, "loss": 4.0},
        ),
        StepFactory(run=run, step=3, reward_mean=0.75, metrics={"tokens_per_second": 1000.0}, timings={}),
    ]
    paint = run_chart_data(run=run)["series"]
    for step in steps:
        live = step_series(step)
        assert set(live) == set(DEFAULT_SERIES)
        for name in DEFAULT_SERIES:
            drawn = dict(zip(paint[name]["x"], paint[name]["y"], strict=True))
            assert live[name] == drawn.get(step.step), (step.step, name)
    # The rules at work, not only agreeing: a timings fallback, and values neither path draws.
    assert step_series(steps[0])["tokens_per_second"] == 800.0
    assert step_series(steps[1])["tokens_per_second"] == 900.0
    assert step_series(steps[1])["loss"] is None and step_series(steps[1])["kl"] is None
    assert step_series(steps[0])["entropy"] == round(1.0 / 3, 6)
    assert step_message(steps[0], steps_done=3, num_steps=3)["series"] == step_series(steps[0])


@pytest.mark.django_db(transaction=True)
def test_the_first_paint_and_the_figures_messages_carry_the_same_values(alice, as_user, listen):
    started = timezone.now() - timedelta(hours=2)
    run = RunFactory(
        owner=alice,
        status=Run.Status.FAILED,
        num_steps=10,
        steps_done=3,
        latest_reward=0.4567,
        best_val_reward=0.683,
        started_at=started,
        error="CUDA out of memory: lower micro_batch_tokens.",
    )
    for step in (1, 2, 3):
        CheckpointFactory(run=run, step=step, size_bytes=2048 * step, val_reward=0.5 if step == 2 else None)
    Checkpoint.objects.filter(run=run, step=1).update(state=Checkpoint.State.DELETED)
    client = as_user(alice)
    page = first_paint(client, run)
    row = list_row(client, run)
    page_group, list_group = listen(run_group_name(run.id)), listen(runs_user_group(alice.id))

    figures_send(run.id, checkpoint_ids=[c.id for c in Checkpoint.objects.filter(run=run)], to_list=True)

    summary, *checkpoints = page_group()
    assert summary == {"type": "summary", "run": run.id, **page["summary"]}
    assert page["page_data"]["summary"] == page["summary"]
    assert page["summary"] == {
        "status": "failed",
        "steps_done": 3,
        "num_steps": 10,
        "latest_reward": 0.4567,
        "best_val_reward": 0.683,
        "started_at": timezone.localtime(started).isoformat(),
        "error": "CUDA out of memory: lower micro_batch_tokens.",
        "checkpoints": 3,
    }
    assert checkpoints == page["checkpoints"]  # newest step first, both
    assert [(c["step"], c["state"], c["download"] is not None) for c in checkpoints] == [
        (3, "active", True),
        (2, "active", True),
        (1, "deleted", False),
    ]
    assert checkpoints[1]["val_reward"] == 0.5 and checkpoints[1]["size"] == "4.0\xa0KB"
    assert list_group() == [row] == [run_row_message(Run.objects.get(id=run.id))]
    body = client.get(reverse("run-detail", args=[run.id])).content.decode()
    assert 'Checkpoints (<span id="checkpoints-count">3</span>)' in body
    assert '<div class="value" id="run-best">0.683</div>' in body


@pytest.mark.django_db(transaction=True)
def test_a_committed_step_is_followed_by_the_runs_figures_and_its_checkpoint(alice, as_user, listen, tmp_path):
    run = RunFactory(owner=alice, status=Run.Status.RUNNING, num_steps=4, started_at=timezone.now())
    page_group, list_group = listen(run_group_name(run.id)), listen(runs_user_group(alice.id))
    metrics = {"reward_mean": 0.5, "reward_std": 0.1, "loss": 0.2, "tokens_per_second": 950.0, "entropy": 1.1}
    ckpt = tmp_path / "step-1"
    ckpt.mkdir()
    with transaction.atomic():
        step_commit(run, 1, {"reward_mean": 0.5, "reward_std": 0.1}, 0.683, metrics, {"step": 4.0}, ckpt, {})
        assert page_group() == []  # nothing leaves before the commit

    step, summary, checkpoint = page_group()
    client = as_user(alice)
    page = first_paint(client, run)
    assert step["type"] == "step" and step["series"]["tokens_per_second"] == 950.0
    assert step["series"]["duration_s"] == 4.0 and step["series"]["val_reward"] == 0.683
    assert summary == {"type": "summary", "run": run.id, **page["summary"]}
    assert (summary["steps_done"], summary["best_val_reward"], summary["checkpoints"]) == (1, 0.683, 1)
    assert [checkpoint] == page["checkpoints"] and checkpoint["step"] == 1
    assert [m["type"] for m in list_group()] == ["step", "run"]


@pytest.mark.django_db(transaction=True)
def test_a_start_reaches_the_page_and_the_list_with_its_time(alice, as_user, listen):
    run = RunFactory(owner=alice, status=Run.Status.STARTING, worker="gpu-1:1")  # the worker that claimed it
    page_group, list_group = listen(run_group_name(run.id)), listen(runs_user_group(alice.id))
    run_transition(run=run, from_statuses=(Run.Status.STARTING,), to_status=Run.Status.RUNNING)
    run.refresh_from_db()
    assert run.started_at is not None
    started = timezone.localtime(run.started_at).isoformat()

    messages = page_group()
    assert [m["type"] for m in messages] == ["event", "status", "summary"]
    assert messages[-1]["started_at"] == started and messages[-1]["status"] == "running"
    status, row = list_group()
    assert status["type"] == "status" and row == list_row(as_user(alice), run)
    assert row["started_at"] == started and row["status"] == "running"


@pytest.mark.django_db(transaction=True)
def test_a_deleted_checkpoint_reaches_the_page_as_its_row(alice, as_user, listen, tmp_path):
    run = RunFactory(owner=alice, status=Run.Status.COMPLETED, steps_done=2)
    kept = CheckpointFactory(run=run, step=2, path=str(tmp_path / "step-2"))
    gone = CheckpointFactory(run=run, step=1, path=str(tmp_path / "step-1"))
    page_group = listen(run_group_name(run.id))
    checkpoint_delete(checkpoint=gone, actor=alice)

    event, summary, row = page_group()
    assert event["type"] == "event" and event["kind"] == "checkpoint_deleted" and event["checkpoint"] == gone.id
    assert summary["checkpoints"] == 2  # a deleted checkpoint stays listed
    assert row == first_paint(as_user(alice), run)["checkpoints"][1]
    assert (row["id"], row["state"], row["download"]) == (gone.id, "deleted", None)
    assert kept.state == Checkpoint.State.ACTIVE


@pytest.mark.django_db(transaction=True)
async def test_a_catch_up_brings_the_summary_and_the_checkpoints_since_the_first_paint(alice):
    run = await sync_to_async(RunFactory)(
        owner=alice,
        status=Run.Status.RUNNING,
        steps_done=1,
        best_val_reward=0.5,
        started_at=timezone.now(),
        worker="gpu-1:1",  # training its next step: not in the queue
    )
    before = timezone.now() - timedelta(minutes=5)
    checkpoint = await sync_to_async(CheckpointFactory)(run=run, step=1)
    comm, connected, _ = await _connect(f"/ws/runs/{run.id}/", alice)
    assert connected

    # A page painted before the checkpoint: the summary first, then the checkpoint's row.
    await comm.send_json_to({"type": "catch_up", "after_step": 1, "checkpoints_since": before.isoformat()})
    status = await comm.receive_json_from(timeout=5)
    assert status["type"] == "status" and status["actions"] == ["cancel", "pause"]
    assert (status["checkpoints"], status["best_val_reward"]) == (1, 0.5)
    assert status["started_at"] == timezone.localtime(run.started_at).isoformat()
    row = await comm.receive_json_from(timeout=5)
    assert row["type"] == "checkpoint" and row["id"] == checkpoint.id
    assert await comm.receive_nothing(timeout=0.3)

    # A page painted after it (beyond the clock margin) is told of no checkpoint.
    later = timezone.now() + timedelta(minutes=5)
    await comm.send_json_to({"type": "catch_up", "after_step": 1, "checkpoints_since": later.isoformat()})
    assert (await comm.receive_json_from(timeout=5))["type"] == "status"
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
def test_a_validation_reward_an_art_client_logs_reaches_the_page(alice, listen):
    from training.client_runs.services import client_val_reward_record

    run = RunFactory(owner=alice, status=Run.Status.RUNNING, steps_done=0)
    page_group = listen(run_group_name(run.id))
    client_val_reward_record(run=run, reward=0.625)
    summary = [m for m in page_group() if m["type"] == "summary"]
    assert summary and summary[-1]["best_val_reward"] == 0.625
