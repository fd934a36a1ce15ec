"""The fair queue with the real parts: PostgreSQL, Redis as the broker, one Celery GPU worker process started
as `make run` starts it (prefork pool), artweb's CTranslate2 server with the default model, the sandboxed
example task and the PEFT trainer. The runs are launched through the service the API and the pages call, so
their step messages reach the broker in launch order."""

from __future__ import annotations

import pytest

from artweb.testing import stack
from rollouts.services import reward_create, scenario_set_create, script_create
from tests.e2e.conftest import EXAMPLES
from training.models import Run, Step
from training.services import run_create

pytestmark = pytest.mark.e2e

ONE_STEP = {
    "num_steps": 1,
    "group_size": 2,
    "scenarios_per_step": 2,
    "max_tokens": 16,
    "val_every": 0,
    "train": {"learning_rate": 5e-5},
}


def inputs_of(user, base_model) -> dict:
    """The example task uploaded by `user`, on the registered base model."""
    return {
        "owner": user,
        "base_model": base_model,
        "script_version": script_create(owner=user, name="example", content=(EXAMPLES / "rollout.py").read_text()),
        "reward_version": reward_create(owner=user, name="example", content=(EXAMPLES / "reward.py").read_text()),
        "scenario_set": scenario_set_create(
            owner=user, name="example", jsonl=(EXAMPLES / "scenarios.jsonl").read_text()
        ),
    }


@pytest.mark.inference_engine("ctranslate2")
def test_three_runs_of_one_user_do_not_hold_back_another_users_run(
    example_run_inputs, stack_env, procs, tmp_path, django_user_model
):
    """Alice launches three runs, then bob one, before the GPU worker starts: in arrival order bob's step
    would be the fourth. The worker trains alice's first run (its own message, nobody has GPU time yet),
    then gives its next turn to bob, who has used none; alice's other two follow."""
    bob = django_user_model.objects.create_user("bob", "bob@example.com", "bob-pass-123")
    alices = [run_create(name=f"alice-{i}", config=ONE_STEP, **example_run_inputs) for i in range(3)]
    bobs = run_create(name="bob", config=ONE_STEP, **inputs_of(bob, example_run_inputs["base_model"]))
    procs.append(stack.start_gpu_worker(stack_env, tmp_path / "logs", pool="prefork"))

    stack.wait_for(
        lambda: not Run.objects.exclude(status__in=Run.FINAL_STATUSES).exists(),
        timeout=900,
        interval=2,
        procs=procs,
        what="the four runs to finish",
    )
    for run in (*alices, bobs):
        run.refresh_from_db()
        assert run.status == Run.Status.COMPLETED, (run.error, procs[-1].tail())
    recorded = list(Step.objects.order_by("created_at").values_list("run_id", "step"))
    assert recorded[:2] == [(alices[0].id, 1), (bobs.id, 1)], recorded
    assert sorted(recorded) == sorted((run.id, 1) for run in (*alices, bobs))  # each step once
