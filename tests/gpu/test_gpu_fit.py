"""The trainer sizes itself on a CUDA device (training.engine.fit): the micro-batch from the model's shape
and the memory left, then from the first update's measured peak; a model that cannot fit is refused
before any weight is loaded; a 4-bit base (bitsandbytes NF4) trains.

Skipped where torch sees no CUDA device (CI and the CPU machines); the estimate itself is tested on the
CPU in tests/training/engine/test_fit.py. On a GPU host: `pytest tests/gpu/test_gpu_fit.py -s`.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
from pathlib import Path

import pytest

CUDA = importlib.util.find_spec("torch") is not None and __import__("torch").cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA device")]

SHAPES = Path(__file__).resolve().parents[2] / "bench" / "shapes"
GiB = 1 << 30


def _groups(tokenizer, words: int = 300, groups: int = 8):
    from tests.training.engine.conftest import trajectory

    long = " ".join(f"word{i}" for i in range(words))
    return [
        [trajectory(tokenizer, f"Question {g}?", f"{long} {i}", reward=float(i % 2)) for i in range(8)]
        for g in range(groups)
    ]


@pytest.fixture
def capped():
    """Cap this process's share of the card at `allocated now + headroom` bytes; lifted after the test."""
    import torch

    def cap(headroom: int) -> None:
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_allocated() + headroom) / total)

    yield cap
    torch.cuda.set_per_process_memory_fraction(1.0)


def test_the_budget_is_sized_from_free_memory_then_from_the_measured_peak(vllm_model_dir, capped):
    import torch

    from training.engine import fit
    from training.engine.config import TrainConfig
    from training.engine.trainer import make_trainer

    capped(12 * GiB)  # the card's other users, as a vLLM server beside the trainer would be
    trainer = make_trainer(TrainConfig(backend="peft"), base_model_path=str(vllm_model_dir), device="cuda", seed=3)
    trainer.load(None)
    sized = trainer.micro_batch_tokens
    print(f"sized at load: {sized} tokens, {fit.gib(fit.cuda_available('cuda'))} left after the weights")
    assert fit.MIN_FIT_TOKENS <= sized <= fit.MAX_AUTO_TOKENS and sized != fit.CPU_DEFAULT_TOKENS

    groups = _groups(trainer.tokenizer)  # ~600 tokens a trajectory, 64 of them
    first = trainer.train_step(groups)
    measured = trainer.micro_batch_tokens
    peak = torch.cuda.max_memory_allocated()
    print(
        f"first update: {first['micro_batches']} micro-batches of at most {first['micro_batch_tokens_before']} "
        f"tokens, {first['out_of_memory_retries']} out-of-memory retries, peak {fit.gib(peak)}; "
        f"budget from its peak {measured} tokens"
    )
    assert first["out_of_memory_retries"] == 0 and math.isfinite(first["loss"])
    assert first["micro_batch_tokens"] == measured and fit.MIN_FIT_TOKENS <= measured <= fit.MAX_AUTO_TOKENS
    second = trainer.train_step(groups)
    assert second["out_of_memory_retries"] == 0 and second["micro_batch_tokens_before"] == measured
    trainer.close()


def test_a_model_that_cannot_fit_is_refused_before_its_weights_load(tmp_path, vllm_model_dir, capped):
    import torch

    from training.engine import fit
    from training.engine.config import TrainConfig
    from training.engine.trainer import make_trainer

    model = tmp_path / "qwen2.5-7b"
    model.mkdir()
    shutil.copy(SHAPES / "qwen2.5-7b" / "config.json", model / "config.json")  # no weights: none are read
    capped(6 * GiB)
    before = torch.cuda.memory_allocated()
    trainer = make_trainer(TrainConfig(backend="peft"), base_model_path=str(model), device="cuda")
    with pytest.raises(fit.TrainerDoesNotFit) as refused:
        trainer.load(None)
    print(refused.value)
    assert "Training qwen2.5-7b needs about" in str(refused.value) and "are free" in str(refused.value)
    assert "ARTWEB_VLLM_KV_CACHE_GB" in str(refused.value)
    assert torch.cuda.memory_allocated() <= before  # nothing loaded (the trainer freed what it held)


def test_a_4bit_base_trains_in_less_memory(vllm_model_dir):
    import torch

    from training.engine.config import TrainConfig
    from training.engine.trainer import make_trainer

    held = {}
    for quantization in ("none", "4bit"):
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        cfg = TrainConfig(backend="peft", base_quantization=quantization, micro_batch_tokens=8192)
        trainer = make_trainer(cfg, base_model_path=str(vllm_model_dir), device="cuda", seed=5)
        trainer.load(None)
        held[quantization] = torch.cuda.memory_allocated() - before
        metrics = trainer.train_step(_groups(trainer.tokenizer, words=40, groups=4))
        print(f"{quantization}: weights and LoRA {held[quantization] / 2**20:.0f} MiB, loss {metrics['loss']:.4f}")
        assert metrics["optimizer_stepped"] == 1 and math.isfinite(metrics["loss"]) and metrics["tokens_trained"] > 0
        trainer.close()
    assert held["4bit"] < held["none"] * 0.75
