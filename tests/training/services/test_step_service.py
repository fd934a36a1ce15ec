"""The step service's own logic: run_step_execute, as a GPU worker calls it, from claiming the run to
queueing the next step.

Test doubles stand for the two parts that cannot run in a unit test: the vLLM inference server
(`FakeServer`, an address never dialled: the scripts here do not call the model) and the PEFT trainer
(`FakeTrainer`, which computes the advantages with the engine's own function and writes a checkpoint
directory, but trains no weights). Both are covered by the end-to-end tests (tests/e2e, tests/gpu); here
the subject is what the service does around them. Everything else is real: PostgreSQL, the jailed
sandbox running the rollout script, the Redis channel layer carrying the run page's messages.

The tests use transactional databases: the lease's heartbeat runs in a thread with a connection of its
own, which must see the run as committed (and so must the on-commit broadcasts). No Celery worker runs
here, so the messages the service sends to tasks (the next step, exports) are recorded, not sent.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.utils import timezone

from artweb.testing.factories import RolloutScriptVersionFactory, RunFactory
from rollouts.sandbox.prestart import prestarted
from training.analytics.heatmap import CELL
from training.config import run_config_parse
from training.engine.advantages import compute_advantages
from training.engine.trainer import Cancelled
from training.exports.tasks import run_exports_task
from training.models import Checkpoint, HeatmapColumn, Run, RunEvent, Step, Trajectory, TrajectoryGroup
from training.services import inference, run_cancel, run_pause
from training.services.broadcast import run_group_name
from training.services.steps import run_step_execute
from training.tasks import run_step_task

pytestmark = pytest.mark.django_db(transaction=True)

# Four training scenarios (w0..w3) and two held-out ones (w4, w5), as ScenarioSetFactory makes them.
# Per step: w0's two rollouts score the same (a dead group); w1, w2 and w3 score 0 then 1; w1's answer
# stops at max_tokens (a choice whose finish_reason is "length", as the OpenAI client returns it).
# Held-out scenarios score 0.25. The sandbox runs a batch's rollouts in one process: the counter
# numbers each scenario's rollouts within the batch.
SCRIPT = """
import art, collections

seen = collections.Counter()


class Choice:
    def __init__(self, content, finish_reason):
        self.message = {"role": "assistant", "content": content}
        self.finish_reason = finish_reason
        self.logprobs = None


async def rollout(model, scenario):
    answer = scenario["answer"]
    n = seen[answer]
    seen[answer] += 1
    if answer == "w0":
        reward = 0.5
    elif answer in ("w4", "w5"):
        reward = 0.25
    else:
        reward = float(n % 2)
    last = Choice(answer, "length") if answer == "w1" else {"role": "assistant", "content": answer}
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": scenario["prompt"]}, last],
                          reward=reward)
"""
STEP_REWARD = (0.5 + 0.5 + 3 * (0.0 + 1.0)) / 8


class FakeServer:
    """Stands for the vLLM server with runtime LoRA adapters (merged: one policy at a time, as on a CPU):
    remembers the adapters the step asks it to serve."""

    base_url = "http://127.0.0.1:9/v1"
    api_key = "k"
    merged = False
    engine = "vLLM"
    base_model_name = "SmolLM2-135M-Instruct"

    def __init__(self):
        self.adapters: dict[str, str] = {}
        self.loads: list[str] = []  # the adapters asked for, in order

    def ensure_base(self) -> str:
        return self.base_model_name

    def ensure_adapter(self, name: str, path: str) -> None:
        self.adapters[name] = path
        self.loads.append(name)

    def retire_adapters(self, keep) -> None:
        self.adapters = {k: v for k, v in self.adapters.items() if k in keep}

    def loaded_adapter_paths(self):
        return list(self.adapters.values())


class FakeTrainer:
    """Stands for the PEFT trainer: real advantages (the engine's compute_advantages), fixed figures for
    the update, a checkpoint directory with one file. `during_update` runs inside train_step: what the
    rest of the world does while the update trains."""

    def __init__(self, world, checkpoint_dir):
        self.world, self.loaded_from = world, checkpoint_dir

    def train_step(self, groups, should_stop=None):
        self.world.updates.append(groups)
        if self.world.during_update:
            self.world.during_update(should_stop)
        return {
            "loss": 0.125,
            "kl": 0.0,
            "grad_norm": 1.5,
            "optimizer_stepped": 1,
            "advantages": compute_advantages(groups).values,
            **self.world.update_figures,
        }

    def save_checkpoint(self, directory: str) -> dict:
        Path(directory).mkdir(parents=True)
        (Path(directory) / "adapter_model.safetensors").write_bytes(b"\0" * 64)
        return {"size_bytes": 64}

    def close(self) -> None:
        self.world.closed += 1


class World:
    """What the step talked to: the trainers it made, the updates it ran, the task messages it sent."""

    def __init__(self):
        self.server = FakeServer()
        self.trainers: list[FakeTrainer] = []
        self.updates: list = []
        self.during_update = None
        self.update_figures: dict = {}  # more of the update's own figures, as the trainer reports them
        self.closed = 0
        self.next_steps: list[tuple] = []
        self.exports: list[dict] = []


@pytest.fixture
def world(monkeypatch, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    settings.ARTWEB = {**settings.ARTWEB, "HEARTBEAT_SECONDS": 1}  # the lease's thread checks every second
    w = World()
    monkeypatch.setattr(inference, "inference_server", lambda base_model, run=None: w.server)
    monkeypatch.setattr(inference, "vocab_size", lambda base_model: None)

    def trainer_for(run, *, checkpoint_dir):
        w.trainers.append(FakeTrainer(w, checkpoint_dir))
        return w.trainers[-1]

    monkeypatch.setattr(inference, "trainer_for", trainer_for)
    monkeypatch.setattr(inference, "trainer_close", lambda: setattr(w, "closed", w.closed + 1))
    monkeypatch.setattr(
        run_step_task, "apply_async", lambda args=(), kwargs=None, **o: w.next_steps.append((tuple(args), kwargs or {}))
    )
    monkeypatch.setattr(run_exports_task, "apply_async", lambda args=(), kwargs=None, **o: w.exports.append(kwargs))
    return w


@pytest.fixture
def listen():
    """The messages the run page's WebSocket group received (the real Redis channel layer)."""
    layer = get_channel_layer()
    joined = []

    def join(run: Run):
        channel = f"tests-steps-{run.id}-{time.monotonic_ns()}"
        async_to_sync(layer.group_add)(run_group_name(run.id), channel)
        joined.append((run_group_name(run.id), channel))

        async def drain():
            out = []
            while True:
                try:
                    out.append((await asyncio.wait_for(layer.receive(channel), 1.0))["message"])
                except TimeoutError:
                    return out

        return lambda: async_to_sync(drain)()

    yield join
    for group, channel in joined:
        async_to_sync(layer.group_discard)(group, channel)


def make_run(owner, **config) -> Run:
    settings = {"group_size": 2, "scenarios_per_step": 4, "concurrency": 1, "val_every": 0, "num_steps": 3, **config}
    return RunFactory(
        owner=owner,
        status=Run.Status.QUEUED,
        num_steps=settings["num_steps"],
        config=run_config_parse(settings).model_dump(),
        reward_version=None,
        script_version=RolloutScriptVersionFactory(asset__owner=owner, content=SCRIPT),
    )


def execute(run: Run, step: int | None = None) -> Run:
    run_step_execute(run_id=run.id, step=step)
    run.refresh_from_db()
    return run


def test_it_records_a_completed_step_once_with_its_metrics_checkpoint_and_advantages(alice, world, listen):
    run = make_run(alice)
    received = listen(run)
    run = execute(run, step=1)

    assert run.status == Run.Status.RUNNING and run.steps_done == 1 and run.worker == ""
    assert run.latest_reward == pytest.approx(STEP_REWARD)
    (step,) = Step.objects.filter(run=run)
    assert step.step == 1 and step.reward_mean == pytest.approx(STEP_REWARD) and step.val_reward is None
    m = step.metrics
    assert (m["groups"], m["rollouts"], m["rollout_errors"], m["groups_no_signal"]) == (4, 8, 0, 1)
    assert m["dead_group_share"] == pytest.approx(0.25)  # w0's group: both rollouts scored 0.5
    assert m["effective_batch"] == 6  # the dead group's two trajectories move nothing
    assert m["truncation_rate"] == pytest.approx(0.25)  # w1's two answers stopped at max_tokens
    assert (m["loss"], m["grad_norm"]) == (0.125, 1.5)  # the update's own figures, as the trainer gave them
    assert "advantages" not in m
    assert {"rollouts", "persist", "train", "checkpoint", "adapter_load", "step"} <= set(step.timings)

    (ckpt,) = Checkpoint.objects.filter(run=run)
    assert ckpt.step == 1 and ckpt.state == Checkpoint.State.ACTIVE and ckpt.size_bytes == 64
    assert (Path(ckpt.path) / "adapter_model.safetensors").is_file()
    assert world.server.adapters == {f"run-{run.id}@1": ckpt.path}  # the new policy is what vLLM serves
    assert world.trainers[0].loaded_from is None  # step 1 starts from a fresh adapter

    groups = {g.scenario.data["answer"]: g for g in TrajectoryGroup.objects.filter(run=run, step=1)}
    assert set(groups) == {"w0", "w1", "w2", "w3"} and groups["w0"].skipped and not groups["w2"].skipped
    advantages = {a: [t.advantage for t in g.trajectories.order_by("index")] for a, g in groups.items()}
    assert advantages["w0"] == [0.0, 0.0]
    assert advantages["w2"] == [pytest.approx(-1.0, abs=1e-4), pytest.approx(1.0, abs=1e-4)]
    assert Trajectory.objects.get(group=groups["w1"], index=0).truncated
    # The commit stores the step's heatmap column: one cell per scenario, the group's mean.
    (column,) = HeatmapColumn.objects.filter(run=run, step=1)
    cells = np.frombuffer(bytes(column.cells), dtype=CELL)
    assert column.split == "train" and sorted(cells["scenario"]) == sorted(g.scenario_id for g in groups.values())
    by_scenario = {int(c["scenario"]): float(c["sum"]) for c in cells}
    assert by_scenario == {g.scenario_id: pytest.approx(g.reward_mean) for g in groups.values()}

    assert world.next_steps == [((run.id,), {"step": 2})]  # queued after the commit
    assert world.exports == [{"reason": "step", "step": 1}]
    messages = received()
    (step_message,) = [m for m in messages if m["type"] == "step"]
    assert step_message["step"] == 1 and step_message["steps_done"] == 1 and step_message["num_steps"] == 3
    assert step_message["metrics"]["dead_group_share"] == pytest.approx(0.25)
    assert step_message["metrics"]["effective_batch"] == 6
    # Each group goes to the page twice: scored while the update trains, then with its advantages.
    assert len([m for m in messages if m["type"] == "group"]) == 8
    assert [m["status"] for m in messages if m["type"] == "status"] == ["starting", "running"]


def test_an_update_that_fitted_after_running_out_of_memory_says_so_on_the_timeline(alice, world):
    world.update_figures = {"out_of_memory_retries": 2, "micro_batch_tokens_before": 8192, "micro_batch_tokens": 2048}
    run = execute(make_run(alice), step=1)
    assert run.steps_done == 1  # the step itself went on as any other
    (event,) = RunEvent.objects.filter(run=run, kind="update_out_of_memory")
    assert "ran out of GPU memory with micro-batches of 8192 tokens; it ran again with 2048 (2 retries)" in (
        event.message
    )
    assert "Set train.micro_batch_tokens to 2048" in event.message
    assert event.data["level"] == "warning" and event.data["micro_batch_tokens"] == 2048
    world.update_figures = {"out_of_memory_retries": 0, "micro_batch_tokens_before": 2048, "micro_batch_tokens": 2048}
    execute(run, step=2)
    assert RunEvent.objects.filter(run=run, kind="update_out_of_memory").count() == 1  # no retry, no event


def test_a_second_execution_of_a_done_step_does_nothing(alice, world):
    run = execute(make_run(alice), step=1)
    before = (
        list(TrajectoryGroup.objects.filter(run=run).values_list("id", flat=True)),
        run.events.count(),
        len(world.updates),
        len(world.next_steps),
    )

    run = execute(run, step=1)  # a redelivered message for step 1

    assert run.steps_done == 1 and Step.objects.filter(run=run).count() == 1
    assert Checkpoint.objects.filter(run=run).count() == 1
    after = (
        list(TrajectoryGroup.objects.filter(run=run).values_list("id", flat=True)),
        run.events.count(),
        len(world.updates),
        len(world.next_steps),
    )
    assert after == before and run.worker == ""


def test_the_new_policy_is_loaded_before_the_step_is_recorded_so_retention_may_delete_the_last(alice, world):
    """keep_last_checkpoints=1: the step's retention deletes the checkpoint the server held until now, which
    it can only once the new policy has replaced it (merged weights: one policy at a time)."""
    world.server.merged = True
    run = execute(make_run(alice, keep_last_checkpoints=1, keep_best_checkpoints=0), step=1)
    run = execute(run, step=2)
    assert run.steps_done == 2 and run.status == Run.Status.RUNNING, run.error
    assert world.server.adapters == {f"run-{run.id}@2": Checkpoint.objects.get(run=run, step=2).path}
    assert Checkpoint.objects.get(run=run, step=1).state == Checkpoint.State.DELETED
    assert "adapter_load" in Step.objects.get(run=run, step=2).timings


def test_it_leaves_a_run_that_another_live_worker_holds_alone(alice, world):
    run = make_run(alice)
    Run.objects.filter(id=run.id).update(status=Run.Status.RUNNING, worker="elsewhere:1", heartbeat_at=timezone.now())
    run = execute(run, step=1)
    assert run.worker == "elsewhere:1" and run.steps_done == 0
    assert not world.updates and not TrajectoryGroup.objects.filter(run=run).exists()


def test_a_step_that_another_worker_recorded_meanwhile_is_not_recorded_twice(alice, world):
    run = make_run(alice)

    def another_worker_commits_step_1(should_stop):
        Run.objects.filter(id=run.id).update(steps_done=1)
        Step.objects.create(run=run, step=1, reward_mean=0.9)

    world.during_update = another_worker_commits_step_1
    run = execute(run, step=1)

    assert run.steps_done == 1 and list(Step.objects.filter(run=run).values_list("reward_mean", flat=True)) == [0.9]
    assert not Checkpoint.objects.filter(run=run).exists()
    assert not Path(world.server.adapters[f"run-{run.id}@1"]).exists()  # the losing attempt's directory is removed
    assert all(g.failed_attempt for g in TrajectoryGroup.objects.filter(run=run, step=1))
    assert run.status == Run.Status.RUNNING and run.worker == "" and world.next_steps == []


def test_the_run_completes_at_num_steps_and_each_step_continues_from_the_last_checkpoint(alice, world):
    run = make_run(alice, num_steps=2)
    run = execute(run, step=1)
    first = Checkpoint.objects.get(run=run, step=1)
    run = execute(run, step=2)

    assert run.status == Run.Status.COMPLETED and run.steps_done == 2 and run.finished_at is not None
    assert run.events.filter(kind="status", message="Completed 2 steps.").exists()
    assert world.trainers[1].loaded_from == first.path  # step 2 trained on from step 1's weights
    assert world.next_steps == [((run.id,), {"step": 2})]  # and nothing after the last step
    assert [e["reason"] for e in world.exports] == ["step", "step", "finished"]

    run = execute(run, step=3)  # a stray message after the end
    assert run.status == Run.Status.COMPLETED and Step.objects.filter(run=run).count() == 2


@pytest.mark.slow
def test_it_validates_every_val_every_steps_and_at_the_last(alice, world):
    run = make_run(alice, num_steps=3, val_every=2, val_scenarios=2)
    for step in (1, 2, 3):
        run = execute(run, step=step)

    assert dict(Step.objects.filter(run=run).values_list("step", "val_reward")) == {1: None, 2: 0.25, 3: 0.25}
    validation = TrajectoryGroup.objects.filter(run=run, split="validation")
    assert sorted(validation.values_list("step", flat=True)) == [2, 2, 3, 3]
    assert {g.scenario.split for g in validation} == {"validation"}
    assert run.best_val_reward == 0.25 and Checkpoint.objects.get(run=run, step=2).val_reward == 0.25
    assert Step.objects.get(run=run, step=2).metrics["val_reward"] == 0.25
    assert len(world.updates) == 3 and all(len(groups) == 4 for groups in world.updates)  # never on held-out data


def wait_for(should_stop, seconds: float = 10.0) -> None:
    """As the real trainer does between micro-batches: stop once the lease's thread says so."""
    deadline = time.monotonic() + seconds
    while not should_stop():
        assert time.monotonic() < deadline, "the heartbeat never reported the change"
        time.sleep(0.05)
    raise Cancelled("stopped before the optimizer step")


@pytest.mark.slow
def test_the_next_batchs_sandbox_is_prestarted_after_the_update_not_beside_it(alice, world):
    # Beside the update, the pre-start's imports would compete with it for the cores (its cgroup weighs as
    # much as the whole worker, whatever its processes' priority).
    run = make_run(alice)
    key = f"run-{run.id}"
    seen_during_update = []
    world.during_update = lambda should_stop: seen_during_update.append(
        (key in prestarted.keys(), key in prestarted._pending)
    )
    prestarted.discard()
    try:
        run = execute(run, step=1)
        assert run.steps_done == 1
        assert seen_during_update == [(False, False)]  # neither started nor starting while it trained
        assert key in prestarted.keys()  # started once the update was done, for step 2's batch
        run = execute(run, step=2)
        assert run.steps_done == 2 and key in prestarted.keys()  # step 2 took it and pre-started step 3's
        run = execute(run, step=3)
        assert run.status == Run.Status.COMPLETED and key not in prestarted.keys()  # no step 4 to start for
    finally:
        prestarted.discard()


def test_a_cancel_requested_while_the_update_trains_stops_the_step_and_keeps_its_rollouts(alice, world):
    run = make_run(alice)

    def user_cancels(should_stop):
        run_cancel(run=Run.objects.get(id=run.id), actor=alice)
        wait_for(should_stop)

    world.during_update = user_cancels
    run = execute(run, step=1)

    assert run.status == Run.Status.CANCELLED and run.steps_done == 0 and run.worker == ""
    assert run.events.filter(kind="status", message="Cancelled after 0 steps.").exists()
    assert not Step.objects.filter(run=run).exists() and not Checkpoint.objects.filter(run=run).exists()
    groups = TrajectoryGroup.objects.filter(run=run, step=1)
    assert groups.count() == 4 and all(g.failed_attempt for g in groups)  # kept to inspect, never trained on
    assert world.closed >= 1  # the trainer's half-done state is dropped
    assert world.next_steps == []


def test_a_pause_requested_mid_step_lets_the_step_finish_then_pauses(alice, world):
    run = make_run(alice)
    world.during_update = lambda should_stop: run_pause(run=Run.objects.get(id=run.id), actor=alice)
    run = execute(run, step=1)

    assert run.status == Run.Status.PAUSED and not run.pause_requested and run.worker == ""
    assert run.steps_done == 1 and Step.objects.filter(run=run).count() == 1
    assert run.events.filter(kind="status", message="Paused after 1 steps.").exists()
    assert world.next_steps == []  # resuming queues the next step, not the worker


def test_a_worker_that_lost_its_lease_stops_without_touching_the_run(alice, world):
    run = make_run(alice)

    def another_worker_takes_over(should_stop):
        Run.objects.filter(id=run.id).update(worker="elsewhere:1", heartbeat_at=timezone.now())
        wait_for(should_stop)

    world.during_update = another_worker_takes_over
    run = execute(run, step=1)

    assert run.status == Run.Status.RUNNING and run.worker == "elsewhere:1" and run.steps_done == 0
    assert not Step.objects.filter(run=run).exists() and not Checkpoint.objects.filter(run=run).exists()
    # The groups are now the other worker's business: neither marked nor removed.
    assert TrajectoryGroup.objects.filter(run=run, step=1, failed_attempt=False).count() == 4
    assert not run.events.filter(kind="status", data__to="cancelled").exists()
    assert world.next_steps == []


@pytest.mark.slow
def test_retention_keeps_the_newest_checkpoints_and_removes_the_files_of_the_rest(alice, world):
    run = make_run(alice, num_steps=3, keep_last_checkpoints=1, keep_best_checkpoints=0)
    for step in (1, 2, 3):
        run = execute(run, step=step)

    states = dict(Checkpoint.objects.filter(run=run).values_list("step", "state"))
    assert states == {1: "deleted", 2: "deleted", 3: "active"}
    assert [Path(c.path).exists() for c in Checkpoint.objects.filter(run=run).order_by("step")] == [False, False, True]
    assert run.events.filter(kind="checkpoint_deleted").count() == 2
    assert run.status == Run.Status.COMPLETED
