"""The warm-up loads the trainer for the run a step will take next (training.services.warmup.trainer_preload),
and a step takes it without a load of its own (training.services.trainer_pool): the real trainer on a tiny
model, the real fair queue on PostgreSQL. Loads are counted by wrapping GRPOTrainer.load; the GPU's memory
figures, which a CPU cannot give, are stood in for in the fit-check tests (said there)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
from django.db import connections
from django.utils import timezone

from artweb.testing.factories import BaseModelFactory, RunFactory, StepFactory
from tests.training.engine.conftest import default_model_dir, tiny_model_dir, tokenizer, trajectory  # noqa: F401
from training.config import run_config_parse
from training.engine import fit
from training.engine.trainer import GRPOTrainer
from training.models import Checkpoint, Run, RunEvent
from training.services import inference, trainer_pool, warmup

pytestmark = pytest.mark.django_db(transaction=True)  # the warm-up and the steps read the runs from threads

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def empty_pool(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    settings.ARTWEB = {**settings.ARTWEB, "DEVICE": "cpu", "TRAINER_BACKEND": "peft", "RUNS_PER_WORKER": 4}
    trainer_pool.trainer_close()
    yield
    trainer_pool.trainer_close()


class Loads:
    """GRPOTrainer.load wrapped: counts the loads; `hold` makes a load stop midway (after `entered` is set)
    until `release` is set."""

    def __init__(self, monkeypatch):
        self.count = 0
        self.hold = False
        self.entered, self.release = threading.Event(), threading.Event()
        original = GRPOTrainer.load

        def load(trainer, *args, **kwargs):
            self.count += 1
            if self.hold:
                self.entered.set()
                assert self.release.wait(60), "the test never released the load"
            return original(trainer, *args, **kwargs)

        monkeypatch.setattr(GRPOTrainer, "load", load)


@pytest.fixture
def loads(monkeypatch) -> Loads:
    return Loads(monkeypatch)


@pytest.fixture
def tiny(tiny_model_dir):  # noqa: F811
    return BaseModelFactory(name="tiny-llama", source=str(tiny_model_dir), local_path=str(tiny_model_dir))


def queued_run(owner, base_model, **fields) -> Run:
    config = run_config_parse({"group_size": 2, "scenarios_per_step": 2, "num_steps": 3}).model_dump()
    return RunFactory(owner=owner, base_model=base_model, config=config, **{"status": Run.Status.QUEUED, **fields})


def commit_step(run: Run, trainer, directory: Path) -> Checkpoint:
    """What a committed step leaves: its checkpoint's files and row, and the run's count."""
    trainer.save_checkpoint(str(directory))
    run.steps_done += 1
    run.save(update_fields=["steps_done"])
    return Checkpoint.objects.create(run=run, step=run.steps_done, path=str(directory))


def reload(run: Run) -> Run:
    """The run as its step reads it."""
    return Run.objects.select_related("base_model").get(id=run.id)


def test_it_loads_the_trainer_for_the_first_waiting_run_and_its_step_loads_nothing(alice, bob, tiny, loads):
    # Alice used the GPU lately: bob's run, queued later, comes first in the fair queue.
    first = queued_run(bob, tiny)
    later = queued_run(alice, tiny)
    StepFactory(run=RunFactory(owner=alice, status=Run.Status.COMPLETED), duration_s=600, created_at=timezone.now())

    # ready() lets the worker's tasks in once the pool is held for the load: a step then waits for it.
    held_when_ready = []
    assert warmup.trainer_preload(ready=lambda: held_when_ready.append(trainer_pool.trainer_preloading())) is True
    assert held_when_ready[0] is True
    assert loads.count == 1 and trainer_pool.held_runs() == {first.id: 0}
    preloaded = trainer_pool.trainer_loaded()
    assert preloaded is not None

    assert inference.trainer_for(reload(first), checkpoint_dir=None) is preloaded  # the step's call
    assert loads.count == 1
    assert reload(later).status == Run.Status.QUEUED and not RunEvent.objects.exists()  # nothing written


def test_it_loads_a_run_at_its_latest_committed_checkpoint(alice, tiny, loads, tmp_path, make_groups):
    run = queued_run(alice, tiny)
    trainer = inference.trainer_for(reload(run), checkpoint_dir=None)
    trainer.train_step(make_groups())
    checkpoint = commit_step(run, trainer, tmp_path / "step-1")
    trainer_pool.trainer_close()  # a new worker: nothing loaded
    loads.count = 0

    assert warmup.trainer_preload() is True
    assert trainer_pool.held_runs() == {run.id: 1}
    preloaded = trainer_pool.trainer_loaded()
    assert preloaded.step == 1  # the checkpoint's update count, read back
    assert inference.trainer_for(reload(run), checkpoint_dir=checkpoint.path) is preloaded
    assert loads.count == 1


@pytest.fixture
def make_groups(tokenizer):  # noqa: F811
    return lambda: [[trajectory(tokenizer, "2+2?", f"answer {i}", reward=float(i % 2)) for i in range(2)]]


def _preload_in_thread(loads: Loads) -> tuple[threading.Thread, dict]:
    """The warm-up's preload in a thread, its load held midway; returns once the load has begun."""
    out: dict = {}
    loads.hold = True

    def preload():
        try:
            out["loaded"] = warmup.trainer_preload()
        finally:
            connections.close_all()  # this thread's

    thread = threading.Thread(target=preload)
    thread.start()
    assert loads.entered.wait(60), "the preload never began its load"
    return thread, out


def _step_in_thread(run: Run, checkpoint_dir: str | None) -> tuple[threading.Thread, dict]:
    """What a step does in its thread: the fit check before its rollouts, the trainer for its update (timed
    as the step's trainer_load phase)."""
    out: dict = {}

    def step():
        try:
            inference.trainer_fit_check(run)
            out["checked"] = True
            started = time.perf_counter()
            out["trainer"] = inference.trainer_for(run, checkpoint_dir=checkpoint_dir)
            out["trainer_load"] = time.perf_counter() - started
        finally:
            connections.close_all()

    thread = threading.Thread(target=step)
    thread.start()
    return thread, out


def test_a_step_that_starts_during_the_preload_waits_for_it_and_takes_its_trainer(alice, tiny, loads, monkeypatch):
    run = queued_run(alice, tiny)
    checks = []
    monkeypatch.setattr(fit, "check_before_load", lambda *a: checks.append(a))
    preload, preloaded = _preload_in_thread(loads)
    checks.clear()  # the warm-up's own, before its load

    step, out = _step_in_thread(reload(run), None)
    time.sleep(1.0)
    # Its fit check passed at once (the warm-up checked; a card part-filled by the load would say too little
    # is free), and it waits for the load rather than start one.
    assert out.get("checked") and checks == []
    assert "trainer" not in out and loads.count == 1
    held = 0.5
    time.sleep(held)
    loads.release.set()
    step.join(60)
    preload.join(60)

    assert preloaded["loaded"] is True and loads.count == 1
    assert out["trainer"] is trainer_pool.trainer_loaded()
    assert out["trainer_load"] >= held  # the wait for the warm-up's load is the step's trainer_load


def test_a_task_starts_once_the_run_is_chosen_not_once_it_is_loaded(alice, tiny, loads, monkeypatch):
    """The worker's warm-up thread (warm_trainer): the task_prerun hook's wait() lets a task in while the
    load goes on, the pool already held for it, so that the task's step waits for that load."""
    run = queued_run(alice, tiny)
    monkeypatch.setattr(warmup, "_thread", None)  # a process of its own: the warm-up not started yet
    monkeypatch.setattr(warmup, "_imported", threading.Event())
    loads.hold = True
    thread = warmup.warm_trainer()
    assert loads.entered.wait(60), "the warm-up never began its load"

    waited = threading.Thread(target=warmup.wait)
    waited.start()
    waited.join(5)
    assert not waited.is_alive(), "a task waited for the load, not only for the imports"
    assert trainer_pool.trainer_preloading() and trainer_pool.trainer_loaded() is None

    loads.release.set()
    thread.join(60)
    assert trainer_pool.held_runs() == {run.id: 0} and loads.count == 1


def test_a_step_of_another_run_during_the_preload_adopts_the_loaded_weights(alice, bob, tiny, loads, tmp_path):
    waiting = queued_run(alice, tiny)
    other = queued_run(bob, tiny)
    # The other run's committed step 1 (bob's GPU time puts it second in the queue).
    trainer = inference.trainer_for(reload(other), checkpoint_dir=None)
    checkpoint = commit_step(other, trainer, tmp_path / "other-step-1")
    StepFactory(run=other, step=1, duration_s=60, created_at=timezone.now())
    trainer_pool.trainer_close()
    loads.count = 0
    preload, preloaded = _preload_in_thread(loads)
    assert trainer_pool.trainer_preloading()

    step, out = _step_in_thread(reload(other), checkpoint.path)
    time.sleep(0.5)
    assert "trainer" not in out
    loads.release.set()
    step.join(60)
    preload.join(60)

    assert preloaded["loaded"] is True and not trainer_pool.trainer_preloading()
    # The same model: the other run's state adopted on the weights the warm-up loaded, no second load.
    assert loads.count == 1 and out["trainer"] is trainer_pool.trainer_loaded()
    assert trainer_pool.held_runs() == {waiting.id: 0, other.id: 1}


def test_no_waiting_run_loads_nothing(alice, tiny, loads, caplog):
    queued_run(alice, tiny, status=Run.Status.PAUSED)
    queued_run(alice, tiny, worker="gpu-2@host")  # a worker trains it
    with caplog.at_level(logging.INFO, logger="training.services.warmup"):
        assert warmup.trainer_preload() is False
    assert trainer_pool.trainer_loaded() is None and loads.count == 0
    assert "no run waits for a step; no trainer loaded" in caplog.text


def test_it_leaves_a_trainer_a_step_loaded_alone(alice, bob, tiny, loads):
    mine = queued_run(bob, tiny, worker="gpu-1@host")
    queued_run(alice, tiny)
    trainer = inference.trainer_for(reload(mine), checkpoint_dir=None)  # a step holds it
    assert warmup.trainer_preload() is False
    assert trainer_pool.trainer_loaded() is trainer and trainer_pool.held_runs() == {mine.id: 0}
    assert loads.count == 1


def test_a_failing_load_is_logged_and_changes_nothing(alice, tiny, monkeypatch, caplog):
    run = queued_run(alice, tiny)
    monkeypatch.setattr(GRPOTrainer, "load", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("disk unreadable")))
    released = []
    with caplog.at_level(logging.INFO, logger="training.services.warmup"):
        assert warmup.trainer_preload(ready=lambda: released.append(True)) is False

    assert released and trainer_pool.trainer_loaded() is None
    assert f"run {run.id}'s trainer could not be loaded" in caplog.text and "disk unreadable" in caplog.text
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED and run.worker == "" and not RunEvent.objects.exists()


def test_a_run_whose_checkpoint_is_gone_is_left_to_its_step(alice, tiny, loads, caplog):
    run = queued_run(alice, tiny, steps_done=2)  # its step-2 checkpoint was deleted
    with caplog.at_level(logging.INFO, logger="training.services.warmup"):
        assert warmup.trainer_preload() is False
    assert loads.count == 0 and "was deleted" in caplog.text
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED


@pytest.fixture
def on_a_gpu(settings, monkeypatch):
    """A GPU worker's settings; the card's free memory and the server's KV cache, which a CPU cannot give,
    stood in for. The model: the Qwen2.5-7B shape (its config.json alone; no weight is read)."""
    gpu = {"DEVICE": "cuda:0", "TRAINER_BACKEND": "unsloth", "VLLM_CUDA_DEVICES": "", "VLLM_KV_CACHE_GB": 16.0}
    settings.ARTWEB = {**settings.ARTWEB, **gpu}
    card = {"free": 0}
    monkeypatch.setattr(fit, "cuda_available", lambda device: card["free"])
    monkeypatch.setattr(inference, "trainer_fit_check", lambda run: None)  # the step's check passes
    model = BaseModelFactory(name="qwen2.5-7b-shape", local_path=str(REPO / "bench/shapes/qwen2.5-7b"))
    return card, model


def test_on_a_gpu_it_loads_only_where_the_update_fits_beside_the_server_to_come(alice, on_a_gpu, loads, caplog):
    card, model = on_a_gpu
    run = reload(queued_run(alice, model))
    # 7.6B bf16 weights (14.2 GiB) for the server and 16 GiB of KV cache; the trainer needs its own copy.
    card["free"] = 40 * fit.GiB  # enough for the update alone, not beside the server
    assert fit.plan_for(
        inference._train_config(run),
        fit.ModelShape.from_config(fit.read_model_config(model.local_path)),
        card["free"],
        "cuda:0",
    ).fits
    with pytest.raises(fit.TrainerDoesNotFit, match="beside the inference server"):
        warmup._fit_check(run)
    card["free"] = 78 * fit.GiB
    warmup._fit_check(run)  # an H100's: both fit

    card["free"] = 40 * fit.GiB
    with caplog.at_level(logging.INFO, logger="training.services.warmup"):
        assert warmup.trainer_preload() is False
    assert loads.count == 0 and "would not fit here" in caplog.text


def test_on_a_gpu_the_steps_own_fit_check_refuses_first(alice, on_a_gpu, loads, monkeypatch, caplog):
    card, model = on_a_gpu
    queued_run(alice, model)
    card["free"] = 78 * fit.GiB

    def refuse(run):
        raise fit.TrainerDoesNotFit("Training qwen2.5-7b needs about 30 GiB")

    monkeypatch.setattr(inference, "trainer_fit_check", refuse)
    with caplog.at_level(logging.INFO, logger="training.services.warmup"):
        assert warmup.trainer_preload() is False
    assert loads.count == 0 and "needs about 30 GiB" in caplog.text
