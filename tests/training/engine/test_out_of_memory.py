"""An update that runs out of device memory halves its micro-batches and runs again, with the result the
smaller budget gives from the start; one that cannot fit a single sequence says what would.

The out-of-memory error is raised by a stand-in for the device's allocator (a micro-batch over a set number
of positions), since these machines have no GPU; tests/gpu/test_gpu_worker.py runs the same path against a
real CUDA allocator.
"""

from __future__ import annotations

import pytest
import torch

from training.engine.config import TrainConfig
from training.engine.trainer import UpdateOutOfMemory, make_trainer

# Deterministic: no dropout, float32, so an update split differently gives the same gradient up to rounding.
CFG = {"learning_rate": 1e-2, "lora_dropout": 0.0, "dtype": "float32", "micro_batch_tokens": 4096}


@pytest.fixture
def groups(make_trajectory):
    answers = [("4", 1.0), ("5", 0.0), ("four, since two and two make four", 1.0), ("3", 0.2)]
    return [
        [make_trajectory("2+2?", answer, reward) for answer, reward in answers],
        [make_trajectory("Say hi", "hi", 1.0), make_trajectory("Say hi", "hello there, friend", 0.0)],
    ]


def device_holding(trainer, positions: int) -> list[int]:
    """Make trainer's micro-batches fail as a device with room for `positions` positions would; returns the
    sizes of the micro-batches it attempted."""
    attempted = []
    accumulate = trainer._accumulate

    def limited(mb, *args):
        attempted.append(mb.tokens_processed)
        if mb.tokens_processed > positions:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return accumulate(mb, *args)

    trainer._accumulate = limited
    return attempted


def adapter(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


@pytest.mark.slow
def test_it_halves_the_micro_batches_until_the_update_fits(tiny_model_dir, groups):
    trainer = make_trainer(TrainConfig(**CFG), base_model_path=str(tiny_model_dir), device="cpu")
    trainer.load(None)
    attempted = device_holding(trainer, positions=40)
    metrics = trainer.train_step(groups)

    assert metrics["out_of_memory_retries"] >= 2 and metrics["optimizer_stepped"] == 1
    assert metrics["micro_batch_tokens_before"] == 4096
    assert metrics["micro_batch_tokens"] == 4096 >> metrics["out_of_memory_retries"]
    assert metrics["micro_batches"] > 1 and max(attempted[-metrics["micro_batches"] :]) <= 40
    assert any(size > 40 for size in attempted)  # it did fail first
    halved = adapter(trainer)

    # The same update planned with the smaller budget from the start: the same adapter.
    fresh = make_trainer(
        TrainConfig(**{**CFG, "micro_batch_tokens": metrics["micro_batch_tokens"]}),
        base_model_path=str(tiny_model_dir),
        device="cpu",
    )
    fresh.load(None)
    direct = fresh.train_step(groups)
    assert direct["out_of_memory_retries"] == 0 and direct["micro_batches"] == metrics["micro_batches"]
    for name, weight in adapter(fresh).items():
        torch.testing.assert_close(halved[name], weight, rtol=1e-5, atol=1e-6)
    assert direct["loss"] == pytest.approx(metrics["loss"], rel=1e-5, abs=1e-7)

    # The next update starts from what fitted: no retry.
    again = trainer.train_step(groups)
    assert again["out_of_memory_retries"] == 0 and again["micro_batch_tokens"] == metrics["micro_batch_tokens"]
    trainer.close()
    fresh.close()


def test_an_update_that_cannot_fit_one_sequence_says_what_would(tiny_model_dir, groups):
    trainer = make_trainer(TrainConfig(**CFG), base_model_path=str(tiny_model_dir), device="cpu")
    trainer.load(None)
    device_holding(trainer, positions=3)  # smaller than any one trajectory
    before = adapter(trainer)
    with pytest.raises(UpdateOutOfMemory) as failed:
        trainer.train_step(groups)
    message = str(failed.value)
    assert "even with one sequence per micro-batch" in message and "CUDA out of memory" in message
    assert "max_seq_len" in message and "4-bit" in message and "ARTWEB_VLLM_KV_CACHE_GB" in message
    # Nothing was stepped: the adapter is as it was, and no gradient is left behind.
    for name, weight in adapter(trainer).items():
        assert torch.equal(before[name], weight), name
    assert all(p.grad is None for p in trainer.model.parameters() if p.requires_grad)
    trainer.close()
