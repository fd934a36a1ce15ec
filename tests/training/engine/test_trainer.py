"""Tiny-model updates: finite loss, changed adapter, exact resume, micro-batching, cancellation."""

import json
import math

import pytest
import torch

from training.engine.config import ConfigError, TrainConfig
from training.engine.trainer import Cancelled, make_trainer

# fp32: these tests compare updates for exact equivalence; bf16 rounding depends on batch shapes.
FAST = {"learning_rate": 1e-2, "max_grad_norm": 1.0, "weight_decay": 0.0, "dtype": "float32"}


@pytest.fixture
def groups(make_trajectory):
    return [
        [
            make_trajectory("2+2?", "4", 1.0),
            make_trajectory("2+2?", "5", 0.0),
            make_trajectory("2+2?", "four", 1.0),
            make_trajectory("2+2?", "no idea", None),
        ],
        [make_trajectory("Capital of France?", "Paris", 1.0), make_trajectory("Capital of France?", "Rome", 0.0)],
        [make_trajectory("Say hi", "hi", 0.5), make_trajectory("Say hi", "hello", 0.5)],  # no signal
    ]


@pytest.fixture
def more_groups(make_trajectory):
    return [
        [make_trajectory("3+3?", "6", 1.0), make_trajectory("3+3?", "seven", 0.0), make_trajectory("3+3?", "6!", 0.5)]
    ]


def adapter_weights(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def trained(tiny_model_dir, cfg, checkpoint=None):
    trainer = make_trainer(cfg, base_model_path=str(tiny_model_dir), device="cpu")
    trainer.load(checkpoint)
    return trainer


@pytest.mark.parametrize(
    "cfg",
    [
        TrainConfig(**FAST),
        TrainConfig(**FAST, loss="ppo", loss_aggregation="sequence"),
        TrainConfig(**FAST, loss="gspo", loss_aggregation="sequence", kl_beta=0.1),
    ],
    ids=["cispo-token", "ppo-sequence", "gspo-kl"],
)
def test_it_makes_one_update_with_finite_loss_and_changed_adapter(tiny_model_dir, groups, cfg):
    trainer = trained(tiny_model_dir, cfg)
    before = adapter_weights(trainer)
    metrics = trainer.train_step(groups)

    assert math.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    assert trainer.step == 1 and metrics["optimizer_stepped"] == 1
    assert metrics["groups_used"] == 2 and metrics["groups_skipped"] == 1
    assert metrics["trajectories_trained"] == 5 and metrics["sequences_truncated"] == 0
    assert metrics["tokens_trained"] == sum(
        len(t["messages"][-1]["token_ids"]) for g in groups[:2] for t in g if t["reward"] is not None
    )
    assert metrics["advantages"][0][3] is None and metrics["advantages"][2] == [0.0, 0.0]
    assert json.dumps(metrics)  # flat and serialisable, stored as is
    after = adapter_weights(trainer)
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert any("lora_B" in n for n in changed)
    trainer.close()


@pytest.mark.slow
def test_two_updates_equal_one_update_save_resume_one_update(tiny_model_dir, groups, more_groups, tmp_path):
    # Dropout on, so the test also proves the RNG state is restored.
    cfg = TrainConfig(**FAST, lora_dropout=0.1, warmup_steps=3)
    straight = trained(tiny_model_dir, cfg)
    straight.train_step(groups)
    m_straight = straight.train_step(more_groups)
    expected = adapter_weights(straight)
    straight.close()

    first = trained(tiny_model_dir, cfg)
    first.train_step(groups)
    info = first.save_checkpoint(str(tmp_path / "step-1"))
    first.close()
    assert info["step"] == 1 and info["size_bytes"] > 0
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (tmp_path / "step-1").iterdir()}

    resumed = trained(tiny_model_dir, cfg, checkpoint=str(tmp_path / "step-1"))
    assert resumed.step == 1
    m_resumed = resumed.train_step(more_groups)
    assert resumed.step == 2
    assert m_resumed["learning_rate"] == m_straight["learning_rate"]  # scheduler resumed mid-warmup
    assert m_resumed["loss"] == pytest.approx(m_straight["loss"], rel=1e-5, abs=1e-7)
    got = adapter_weights(resumed)
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-7)


def test_micro_batching_accumulates_to_the_full_batch_update(tiny_model_dir, groups):
    one = trained(tiny_model_dir, TrainConfig(**FAST, loss_aggregation="sequence"))
    m_one = one.train_step(groups)
    many = trained(tiny_model_dir, TrainConfig(**FAST, loss_aggregation="sequence", micro_batch_tokens=16))
    m_many = many.train_step(groups)
    assert m_one["micro_batches"] == 1 and m_many["micro_batches"] == 5
    assert m_many["loss"] == pytest.approx(m_one["loss"], rel=1e-4)
    assert m_many["grad_norm"] == pytest.approx(m_one["grad_norm"], rel=1e-4)
    # Adam's first step is close to lr·sign(grad), so weights whose gradient is ~0 amplify float
    # rounding differences of the summation order; 1e-5 is 0.1% of the lr-sized step.
    a, b = adapter_weights(one), adapter_weights(many)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5)


def test_cancellation_stops_before_the_optimizer_step(tiny_model_dir, groups):
    trainer = trained(tiny_model_dir, TrainConfig(**FAST, micro_batch_tokens=16))
    before = adapter_weights(trainer)
    polls = []

    def should_stop():
        polls.append(1)
        return len(polls) > 2  # let two micro-batches run, stop before the third

    with pytest.raises(Cancelled):
        trainer.train_step(groups, should_stop=should_stop)
    assert trainer.step == 0 and not trainer.optimizer.state
    assert all(p.grad is None for p in trainer.model.parameters())
    after = adapter_weights(trainer)
    assert all(torch.equal(before[n], after[n]) for n in before)
    trainer.train_step(groups)  # and it trains normally afterwards
    assert trainer.step == 1


def test_an_update_without_signal_steps_no_optimizer(tiny_model_dir, make_trajectory):
    trainer = trained(tiny_model_dir, TrainConfig(**FAST))
    before = adapter_weights(trainer)
    metrics = trainer.train_step([[make_trajectory("q", "a", 1.0), make_trajectory("q", "b", 1.0)]])
    assert metrics["optimizer_stepped"] == 0 and metrics["tokens_trained"] == 0 and metrics["groups_skipped"] == 1
    assert trainer.step == 1
    assert all(torch.equal(before[n], p) for n, p in adapter_weights(trainer).items())


def test_sequences_past_max_seq_len_are_truncated_and_counted(tiny_model_dir, make_trajectory):
    trainer = trained(tiny_model_dir, TrainConfig(**FAST, max_seq_len=24))
    long_answer = " ".join(["word"] * 40)
    metrics = trainer.train_step([[make_trajectory("q", long_answer, 1.0), make_trajectory("q", "short", 0.0)]])
    assert metrics["sequences_truncated"] == 1 and metrics["optimizer_stepped"] == 1


def test_resuming_with_another_lora_shape_is_refused(tiny_model_dir, groups, tmp_path):
    trainer = trained(tiny_model_dir, TrainConfig(**FAST))
    trainer.train_step(groups)
    trainer.save_checkpoint(str(tmp_path / "ck"))
    with pytest.raises(ConfigError) as err:
        trained(tiny_model_dir, TrainConfig(**FAST, lora_rank=4), checkpoint=str(tmp_path / "ck"))
    assert err.value.field == "lora_rank"


def test_a_bf16_base_trains_an_fp32_adapter_like_the_fp32_update(tiny_model_dir, groups):
    full = trained(tiny_model_dir, TrainConfig(**FAST))
    m_full = full.train_step(groups)
    half = trained(tiny_model_dir, TrainConfig(**{**FAST, "dtype": "bfloat16"}))
    before = adapter_weights(half)
    m_half = half.train_step(groups)
    base = half.model.get_base_model()
    assert base.get_input_embeddings().weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in half.model.parameters() if p.requires_grad)
    # bf16 keeps ~3 significant digits: the same update, within that precision.
    assert m_half["loss"] == pytest.approx(m_full["loss"], rel=0.05, abs=2e-3)
    assert m_half["grad_norm"] == pytest.approx(m_full["grad_norm"], rel=0.05)
    after = adapter_weights(half)
    assert any(not torch.equal(before[n], after[n]) for n in before)


def test_auto_dtype_is_bf16_exactly_where_the_cpu_multiplies_bf16_in_hardware():
    from training.engine.backends import cpu_has_fast_bf16, resolve_dtype

    expected = torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    assert resolve_dtype("auto", "cpu") == expected
    assert resolve_dtype("auto", "cuda:0") == torch.bfloat16
    assert resolve_dtype("float32", "cuda:0") == torch.float32


def test_a_checkpoint_directory_is_written_once_and_never_half(tiny_model_dir, groups, tmp_path, monkeypatch):
    from training.engine import checkpoint as ckpt

    trainer = trained(tiny_model_dir, TrainConfig(**FAST))
    trainer.train_step(groups)
    trainer.save_checkpoint(str(tmp_path / "step-1"))
    written = {p.name: p.read_bytes() for p in (tmp_path / "step-1").iterdir()}
    # Another attempt at the same directory is refused and changes nothing.
    with pytest.raises(ckpt.CheckpointError, match="written once"):
        trainer.save_checkpoint(str(tmp_path / "step-1"))
    assert {p.name: p.read_bytes() for p in (tmp_path / "step-1").iterdir()} == written

    # Killed while writing (here: a failure after the files, before the rename): no directory at all,
    # and no staging left behind.
    def crash(*args):
        raise OSError("killed")

    monkeypatch.setattr(ckpt, "_fsync_tree", crash)
    with pytest.raises(OSError, match="killed"):
        trainer.save_checkpoint(str(tmp_path / "step-2"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-1"]
    trainer.close()
