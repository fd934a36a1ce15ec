"""Rollouts one step ahead (RunConfig.overlap_rollouts): step k+1's batch runs while step k trains.

Same doubles as test_step_service (see its docstring): the inference server and the trainer are stand-ins,
the jailed sandbox, PostgreSQL and the lease's thread are real. The server here serves runtime LoRA
adapters (`merged = False`) unless a test says otherwise. The rollout script writes, into each
trajectory's metadata, the model name it was given and the policy's step, which is what the batch was
sampled from.
"""

from __future__ import annotations

import time

import pytest

from artweb.testing.factories import RolloutScriptVersionFactory
from rollouts.sandbox import Cancelled
from tests.training.services.test_step_service import FakeServer, execute, make_run, world  # noqa: F401
from training.config import RunConfig
from training.models import Run, RunEvent, Step, Trajectory
from training.services import run_cancel
from training.services.steps import ahead as ahead_module
from training.services.steps.batch import scenarios_sample

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = """
import art, asyncio

SLEEP = 0


async def rollout(model, scenario):
    await asyncio.sleep(SLEEP)
    n = int(scenario["answer"][1:])
    return art.Trajectory(
        messages_and_choices=[{"role": "user", "content": scenario["prompt"]},
                              {"role": "assistant", "content": scenario["answer"]}],
        reward=float(n % 2),
        metadata={"policy": model.get_inference_name(), "policy_step": await model.get_step()},
    )
"""


class LoraServer(FakeServer):
    merged = False


def overlap_run(owner, script: str = SCRIPT, **config) -> Run:
    run = make_run(owner, overlap_rollouts=True, **config)
    run.script_version = RolloutScriptVersionFactory(asset__owner=owner, content=script)
    run.save(update_fields=["script_version"])
    return run


def sampled_by(run: Run, step: int) -> set[tuple]:
    trajectories = Trajectory.objects.filter(group__run=run, group__step=step, group__failed_attempt=False)
    return {(t.metadata["policy"], t.metadata["policy_step"]) for t in trajectories}


@pytest.fixture
def lora(world):  # noqa: F811
    world.server = LoraServer()
    return world


@pytest.mark.slow
def test_the_next_steps_rollouts_run_during_the_update_against_the_policy_before_it(alice, lora):
    run = overlap_run(alice)
    base, first = lora.server.base_model_name, f"run-{run.id}@1"
    seen = []

    def during_update(should_stop):
        ahead = ahead_module._ahead.get(run.id)
        if ahead is None:
            seen.append(None)
            return
        ahead.thread.join(timeout=60)  # it ends while this update still trains
        seen.append((ahead.step, ahead.policy, ahead.error, len(ahead.results or []), set(lora.server.adapters)))

    lora.during_update = during_update
    for step in (1, 2, 3):
        run = execute(run, step=step)
    assert run.status == Run.Status.COMPLETED and run.steps_done == 3

    # During step 1's update, step 2's batch ran against the base model; during step 2's, step 3's ran
    # against step 1's adapter, which the server kept beside step 2's until step 3 had its data.
    assert seen[0] == (2, base, None, 4, set())
    assert seen[1][:4] == (3, first, None, 4)
    assert seen[2] is None  # the last step starts no batch ahead: nothing comes after it
    assert ahead_module._ahead.get(run.id) is None

    assert sampled_by(run, 1) == {(base, 0)}
    assert sampled_by(run, 2) == {(base, 0)}  # one policy version behind the trainer's
    assert sampled_by(run, 3) == {(first, 1)}
    steps = {s.step: s for s in Step.objects.filter(run=run)}
    assert [steps[k].metrics["policy_lag"] for k in (1, 2, 3)] == [0, 1, 1]
    assert "rollouts_ahead" in steps[2].timings and "rollouts_ahead" not in steps[1].timings
    # The batches ahead were the scenarios the steps would have sampled themselves.
    cfg = RunConfig.model_validate(run.config)
    for k in (2, 3):
        expected = [s.id for s in scenarios_sample(run, cfg, k, "train", cfg.scenarios_per_step)]
        got = list(run.groups.filter(step=k, failed_attempt=False).order_by("id").values_list("scenario_id", flat=True))
        assert sorted(got) == sorted(expected)
    # Step 1's adapter was retired once nothing rolled out against it any more.
    assert set(lora.server.adapters) == {f"run-{run.id}@3"}


def test_a_server_that_merges_adapters_runs_steps_in_order_and_the_run_is_told_once(alice, world):  # noqa: F811
    world.server.merged = True  # one policy at a time, as on a CPU
    run = overlap_run(alice)
    starts = []
    world.during_update = lambda should_stop: starts.append(ahead_module._ahead.get(run.id))
    for step in (1, 2):
        run = execute(run, step=step)
    assert starts == [None, None]
    assert [s.metrics["policy_lag"] for s in Step.objects.filter(run=run).order_by("step")] == [0, 0]
    (event,) = RunEvent.objects.filter(run=run, kind="overlap_unavailable")
    assert "ARTWEB_VLLM_ADAPTER_MODE=lora" in event.message
    assert sampled_by(run, 2) == {(f"run-{run.id}@1", 1)}  # in order: step 2 rolled out on step 1's policy


@pytest.mark.slow
def test_a_cancel_during_the_update_stops_the_batch_running_ahead(alice, lora):
    # Every rollout sleeps 3 s: step 1's batch (all 8 in flight) takes 3 s, then the update cancels the run
    # while the batch ahead is asleep.
    run = overlap_run(alice, script=SCRIPT.replace("SLEEP = 0", "SLEEP = 3"), concurrency=8)
    caught = {}

    def during_update(should_stop):
        caught["ahead"] = ahead_module._ahead.get(run.id)
        run_cancel(run=Run.objects.get(id=run.id), actor=alice)
        deadline = time.monotonic() + 30
        while not should_stop() and time.monotonic() < deadline:
            time.sleep(0.1)
        raise Cancelled("stopped by the test's cancel")

    lora.during_update = during_update
    run = execute(run, step=1)
    assert run.status == Run.Status.CANCELLED
    ahead = caught["ahead"]
    assert ahead is not None and ahead.step == 2 and not ahead.thread.is_alive()
    assert isinstance(ahead.error, Cancelled)  # its sandbox was killed, not left to finish its rollouts
    assert ahead.seconds < 3
    assert ahead_module._ahead.get(run.id) is None


@pytest.mark.slow
def test_a_batch_ahead_whose_policy_the_server_no_longer_serves_is_dropped_not_used(alice, lora):
    run = overlap_run(alice)
    for step in (1, 2):
        run = execute(run, step=step)
    ahead = ahead_module._ahead.get(run.id)
    assert ahead is not None and ahead.policy == f"run-{run.id}@1"
    # The server lost the adapter the batch was sampled from (restarted, say): step 3 rolls out anew.
    lora.server.adapters.clear()
    run = execute(run, step=3)
    assert run.status == Run.Status.COMPLETED
    assert ahead.stop.is_set() and not ahead.thread.is_alive()
    assert sampled_by(run, 3) == {(f"run-{run.id}@2", 2)}
    assert Step.objects.get(run=run, step=3).metrics["policy_lag"] == 0
