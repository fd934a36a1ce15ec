"""Runs sharing one loaded trainer (training.services.trainer_pool): a run's steps trained between another
run's give exactly the weights and optimizer state they give alone, whether its state was kept in memory or
read back from its checkpoint; the base weights are loaded once for runs that load the same model, and a
state that an uncommitted update spoiled is never used."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from training.engine.checkpoint import read_checkpoint
from training.engine.config import TrainConfig
from training.engine.trainer import GRPOTrainer, make_trainer
from training.services import trainer_pool

EXACT = {"max_grad_norm": 0.0, "weight_decay": 0.0, "dtype": "float32"}


@pytest.fixture(autouse=True)
def empty_pool(settings):
    settings.ARTWEB = {**settings.ARTWEB, "RUNS_PER_WORKER": 4, "DEVICE": "cpu"}
    trainer_pool.trainer_close()
    yield
    trainer_pool.trainer_close()


def _groups(make_trajectory, tag: str, step: int) -> list[list[dict]]:
    return [
        [make_trajectory(f"{tag} question {step}.{g}?", f"answer {i} {tag}", reward=float(i % 2)) for i in range(4)]
        for g in range(2)
    ]


def _run(run_id: int, seed: int, lr: float, **cfg):
    return SimpleNamespace(
        id=run_id, steps_done=0, config={"seed": seed}, cfg=TrainConfig(learning_rate=lr, **EXACT, **cfg)
    )


def _maker(run, model_dir):
    return lambda: make_trainer(run.cfg, base_model_path=str(model_dir), device="cpu", seed=run.config["seed"])


def _lora(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def _moments(trainer) -> list[torch.Tensor]:
    return [t.clone() for s in trainer.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]


def _alone(run, model_dir, groups_by_step, tmp_path) -> tuple[dict, list]:
    """The run's weights and optimizer moments after its steps, trained by a trainer of its own."""
    trainer = _maker(run, model_dir)()
    trainer.load(None)
    for groups in groups_by_step:
        trainer.train_step(groups)
    return _lora(trainer), _moments(trainer)


def _step(run, model_dir, groups, tmp_path) -> object:
    """One step of `run` as the worker takes it: the pool's trainer at the run's committed step, one update,
    its checkpoint saved and the step committed."""
    ckpt = run.checkpoints[-1] if run.steps_done else None
    trainer = trainer_pool.trainer_for(run, checkpoint_dir=ckpt, make=_maker(run, model_dir))
    trainer.train_step(groups)
    directory = tmp_path / f"run-{run.id}-step-{run.steps_done + 1}"
    trainer.save_checkpoint(str(directory))
    run.steps_done += 1
    run.checkpoints.append(str(directory))
    trainer_pool.trainer_advanced(run.id, run.steps_done, str(directory))
    return trainer


@pytest.mark.parametrize("runs_per_worker", [4, 1], ids=["states-kept", "states-read-from-checkpoints"])
def test_two_runs_interleaved_on_one_trainer_train_exactly_as_alone(
    tiny_model_dir, make_trajectory, tmp_path, settings, runs_per_worker
):
    settings.ARTWEB = {**settings.ARTWEB, "RUNS_PER_WORKER": runs_per_worker}
    a, b = _run(1, seed=1, lr=1e-2), _run(2, seed=2, lr=3e-3, loss="ppo")
    steps = 3
    groups = {r.id: [_groups(make_trajectory, f"r{r.id}", s) for s in range(steps)] for r in (a, b)}
    expected = {r.id: _alone(r, tiny_model_dir, groups[r.id], tmp_path) for r in (a, b)}

    for run in (a, b):
        run.checkpoints = []
    loads = []
    original_load = GRPOTrainer.load

    def counted_load(self, *args, **kwargs):
        loads.append(self)
        return original_load(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(GRPOTrainer, "load", counted_load)
        for s in range(steps):
            for run in (a, b):
                trainer = _step(run, tiny_model_dir, groups[run.id][s], tmp_path)
                if s == steps - 1:
                    lora, moments = _lora(trainer), _moments(trainer)
                    want_lora, want_moments = expected[run.id]
                    assert lora.keys() == want_lora.keys()
                    for name in lora:
                        assert torch.equal(lora[name], want_lora[name]), f"run {run.id}: {name} differs"
                    assert len(moments) == len(want_moments)
                    assert all(torch.equal(x, y) for x, y in zip(moments, want_moments, strict=True))
    # Each run's step 1 starts a fresh LoRA from its own seed: a load each; later steps swap states in.
    assert len(loads) == 2
    assert trainer_pool.held_runs() == ({1: steps, 2: steps} if runs_per_worker > 1 else {2: steps})


def test_as_many_runs_as_the_worker_keeps_take_turns_without_reading_a_checkpoint(
    tiny_model_dir, make_trajectory, tmp_path, monkeypatch
):
    """ARTWEB_RUNS_PER_WORKER=4 and four runs in turn: the least recently trained is the run whose turn comes
    next, and its state is the one wanted (it was dropped to make room for itself, and read back)."""
    runs = [_run(i, seed=i, lr=1e-2) for i in range(1, 5)]
    reads = []
    monkeypatch.setattr(trainer_pool, "_read", lambda directory: reads.append(directory) or read_checkpoint(directory))
    for s in range(2):
        for run in runs:
            run.checkpoints = getattr(run, "checkpoints", [])
            _step(run, tiny_model_dir, _groups(make_trajectory, f"r{run.id}", s), tmp_path)
    assert reads == []
    assert trainer_pool.held_runs() == {run.id: 2 for run in runs}
    # A fifth run's turn drops the least recently trained (run 1), not the run it loads.
    fifth = _run(5, seed=5, lr=1e-2)
    fifth.checkpoints = []
    _step(fifth, tiny_model_dir, _groups(make_trajectory, "r5", 0), tmp_path)
    assert sorted(trainer_pool.held_runs()) == [2, 3, 4, 5]


def test_an_update_no_checkpoint_holds_is_never_swapped_back_in(tiny_model_dir, make_trajectory, tmp_path):
    a, b = _run(1, seed=1, lr=1e-2), _run(2, seed=2, lr=1e-2)
    a.checkpoints, b.checkpoints = [], []
    _step(a, tiny_model_dir, _groups(make_trajectory, "a", 0), tmp_path)
    committed = _lora(trainer_pool.trainer_loaded())
    # An attempt at a's step 2 trains, then fails before its checkpoint: nothing committed it.
    trainer_pool.trainer_for(a, checkpoint_dir=a.checkpoints[-1], make=_maker(a, tiny_model_dir)).train_step(
        _groups(make_trajectory, "a", 1)
    )
    _step(b, tiny_model_dir, _groups(make_trajectory, "b", 0), tmp_path)
    assert 1 not in trainer_pool.held_runs()  # the spoiled state was not parked
    trainer = trainer_pool.trainer_for(a, checkpoint_dir=a.checkpoints[-1], make=_maker(a, tiny_model_dir))
    again = _lora(trainer)
    assert all(torch.equal(again[n], committed[n]) for n in committed)


def test_a_run_whose_step_another_worker_committed_reads_that_checkpoint(tiny_model_dir, make_trajectory, tmp_path):
    a = _run(1, seed=1, lr=1e-2)
    a.checkpoints = []
    _step(a, tiny_model_dir, _groups(make_trajectory, "a", 0), tmp_path)
    mine = _lora(trainer_pool.trainer_loaded())
    # Another worker's attempt at the same step committed a checkpoint of its own (other groups).
    other = _maker(a, tiny_model_dir)()
    other.load(None)
    other.train_step(_groups(make_trajectory, "other", 0))
    theirs_dir = tmp_path / "theirs"
    other.save_checkpoint(str(theirs_dir))
    theirs = _lora(other)
    a.checkpoints[-1] = str(theirs_dir)
    trainer = trainer_pool.trainer_for(a, checkpoint_dir=str(theirs_dir), make=_maker(a, tiny_model_dir))
    now = _lora(trainer)
    assert any(not torch.equal(mine[n], theirs[n]) for n in mine)
    assert all(torch.equal(now[n], theirs[n]) for n in theirs)


def test_a_finished_run_leaves_the_weights_and_the_other_runs_states(
    tiny_model_dir, make_trajectory, tmp_path, monkeypatch
):
    a, b = _run(1, seed=1, lr=1e-2), _run(2, seed=2, lr=1e-2)
    a.checkpoints, b.checkpoints = [], []
    _step(b, tiny_model_dir, _groups(make_trajectory, "b", 0), tmp_path)
    loaded = _step(a, tiny_model_dir, _groups(make_trajectory, "a", 0), tmp_path)
    trainer_pool.trainer_run_finished(a.id)  # a's last step: its state goes, b's stays, and the weights
    assert trainer_pool.held_runs() == {b.id: 1} and trainer_pool.trainer_loaded() is loaded
    reads, loads = [], []
    monkeypatch.setattr(trainer_pool, "_read", lambda directory: reads.append(directory) or read_checkpoint(directory))
    original_load = GRPOTrainer.load
    monkeypatch.setattr(GRPOTrainer, "load", lambda self, *a, **kw: loads.append(self) or original_load(self, *a, **kw))
    assert _step(b, tiny_model_dir, _groups(make_trajectory, "b", 1), tmp_path) is loaded
    assert reads == [] and loads == []  # b's kept state swapped in on the weights loaded
    trainer_pool.trainer_run_finished(b.id)  # the last run held: the idle worker holds no model
    assert trainer_pool.trainer_loaded() is None and trainer_pool.held_runs() == {}


def test_runs_that_load_another_model_do_not_share_the_weights(tiny_model_dir, make_trajectory, tmp_path):
    a, b = _run(1, seed=1, lr=1e-2), _run(2, seed=2, lr=1e-2, lora_rank=4)
    a.checkpoints, b.checkpoints = [], []
    first = _step(a, tiny_model_dir, _groups(make_trajectory, "a", 0), tmp_path)
    second = _step(b, tiny_model_dir, _groups(make_trajectory, "b", 0), tmp_path)
    assert second is not first
    assert {p.shape[0] for n, p in second.model.named_parameters() if "lora_A" in n} == {4}
    # a's state was kept: its next step adopts it on a fresh load of its own model.
    third = _step(a, tiny_model_dir, _groups(make_trajectory, "a", 1), tmp_path)
    assert {p.shape[0] for n, p in third.model.named_parameters() if "lora_A" in n} == {8}


def test_a_sized_micro_batch_budget_travels_with_the_checkpoint_and_the_kept_state(tiny_model_dir, tmp_path):
    """On a GPU the budget is sized by the trainer (from memory, then each update's peak); a resumed or swapped-in
    run continues with the budget it had reached, so its micro-batches, and their sums, are the same."""
    run = _run(1, seed=1, lr=1e-2)
    trainer = _maker(run, tiny_model_dir)()
    trainer.load(None)
    trainer._sizing, trainer.micro_batch_tokens = True, 3008  # as a CUDA update's peak would have set it
    trainer.save_checkpoint(str(tmp_path / "ckpt"))
    for restored in ("checkpoint", "snapshot"):
        other = _maker(run, tiny_model_dir)()
        other._sizing, other.micro_batch_tokens = True, 12032  # sized afresh from the memory free at load
        if restored == "checkpoint":
            other.load(str(tmp_path / "ckpt"))
        else:
            other.load(state=trainer.snapshot())
        assert other.micro_batch_tokens == 3008, restored
    assert read_checkpoint(tmp_path / "ckpt").micro_batch_tokens == 3008
