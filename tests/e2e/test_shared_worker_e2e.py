"""Two users' runs on one GPU worker, with the real parts: PostgreSQL, Redis as the broker, one Celery GPU
worker process started as `make run` starts it (prefork pool), artweb's CTranslate2 server with the default
model, the sandboxed example task and the PEFT trainer. Their steps interleave on the one trainer, each run's
state swapped in for its step (training.services.trainer_pool), and a pool child killed in the middle of a
step loses nothing: every step of both runs is recorded once."""

from __future__ import annotations

import psutil
import pytest

from artweb.testing import stack
from tests.e2e.test_fair_queue_e2e import inputs_of
from training.models import Run, Step
from training.services import run_create

pytestmark = pytest.mark.e2e

THREE_STEPS = {
    "num_steps": 3,
    "group_size": 2,
    "scenarios_per_step": 2,
    "max_tokens": 16,
    "val_every": 0,
    "train": {"learning_rate": 5e-5},
}


@pytest.mark.inference_engine("ctranslate2")
def test_two_users_runs_interleave_on_one_worker_and_survive_a_killed_child(
    example_run_inputs, stack_env, procs, tmp_path, django_user_model
):
    bob = django_user_model.objects.create_user("bob", "bob@example.com", "bob-pass-123")
    alice_run = run_create(name="alice", config=THREE_STEPS, **example_run_inputs)
    bob_run = run_create(name="bob", config=THREE_STEPS, **inputs_of(bob, example_run_inputs["base_model"]))
    worker = stack.start_gpu_worker(stack_env, tmp_path / "logs", pool="prefork")
    procs.append(worker)
    runs = (alice_run.id, bob_run.id)

    # Kill the pool child in the middle of a step once both runs have trained one.
    stack.wait_for(
        lambda: Step.objects.filter(run_id__in=runs).count() >= 2,
        timeout=600,
        interval=1,
        procs=procs,
        what="a step each",
    )
    stack.wait_for(
        lambda: Run.objects.filter(id__in=runs).exclude(worker="").exists(),
        timeout=120,
        interval=0.1,
        what="the next step to start",
    )
    holder = Run.objects.filter(id__in=runs).exclude(worker="").values_list("worker", flat=True).first()
    child = psutil.Process(int(holder.rsplit(":", 1)[1]))
    assert child.ppid() == worker.popen.pid
    child.kill()

    stack.wait_for(
        lambda: not Run.objects.filter(id__in=runs).exclude(status__in=Run.FINAL_STATUSES).exists(),
        timeout=900,
        interval=2,
        procs=[worker],
        what="both runs to finish",
    )
    for run_id in runs:
        run = Run.objects.get(id=run_id)
        assert run.status == Run.Status.COMPLETED, (run.error, worker.tail())
        assert list(Step.objects.filter(run=run).values_list("step", flat=True)) == [1, 2, 3]
        assert run.groups.filter(split="train", failed_attempt=False).count() == 3 * THREE_STEPS["scenarios_per_step"]
    order = list(Step.objects.filter(run_id__in=runs).order_by("created_at").values_list("run_id", flat=True))
    switches = sum(1 for a, b in zip(order, order[1:], strict=False) if a != b)
    assert switches >= 3, order  # interleaved, not one run after the other
    # After the kill the new child reloads; before it, and after its first steps, runs were swapped in.
    assert "adopted on the loaded weights" in worker.log.read_text()
