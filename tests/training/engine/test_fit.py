"""The update's memory estimate and the micro-batch it sizes (training.engine.fit), on the CPU.

The estimate is checked against figures measured on an H200 (bench/results/gpu_shapes.md and the issue's
7B runs); sizing from free memory and the first update's peak need CUDA and are in tests/gpu.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.config import run_config_parse
from training.engine import fit
from training.engine.config import DEFAULT_LORA_TARGETS, ConfigError, TrainConfig
from training.engine.trainer import make_trainer

SHAPES = Path(__file__).resolve().parents[3] / "bench" / "shapes"
GiB = 1 << 30


def shape(name: str) -> fit.ModelShape:
    return fit.ModelShape.from_config(json.loads((SHAPES / name / "config.json").read_text()))


def plan(name: str, available_gib: float, **kw) -> fit.MemoryPlan:
    args = {
        "backend": "unsloth",
        "dtype_bytes": 2,
        "quantization": "none",
        "lora_rank": 8,
        "lora_targets": DEFAULT_LORA_TARGETS,
        "checkpointing": False,
    }
    return fit.plan(shape(name), available=int(available_gib * GiB), **{**args, **kw})


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("qwen2.5-0.5b", 0.49e9),
        ("qwen2.5-1.5b", 1.54e9),
        ("qwen2.5-7b", 7.61e9),
        ("qwen2.5-14b", 14.7e9),
        ("qwen2.5-32b", 32.5e9),
    ],
)
def test_the_parameter_count_matches_the_published_one(name, published):
    # Published counts include the attention biases the estimate leaves out (under 0.1%).
    assert shape(name).parameters() == pytest.approx(published, rel=0.02)


def test_the_7b_estimate_matches_what_an_h200_measured():
    # Measured (unsloth, bf16, no checkpointing): the trainer process peaked at 46.2 GiB with 8,192-token
    # micro-batches and needed about 104 GiB with 32,768-token ones.
    memory = plan("qwen2.5-7b", 104)
    assert memory.need(8192) / GiB == pytest.approx(46.2, rel=0.15)
    assert memory.need(32768) / GiB == pytest.approx(104, rel=0.15)
    # Beside a 35 GiB vLLM on a 140 GiB card, the budget is between the two: 32,768 ran out of memory.
    beside_vllm = plan("qwen2.5-7b", 140 - 35)
    assert 8192 < beside_vllm.micro_batch_tokens < 32768
    assert beside_vllm.micro_batch_tokens % 256 == 0
    assert beside_vllm.need(beside_vllm.micro_batch_tokens) <= beside_vllm.available


def test_more_memory_a_longer_micro_batch_up_to_the_cap():
    budgets = [plan("qwen2.5-1.5b", g).micro_batch_tokens for g in (8, 16, 32, 64, 200)]
    assert budgets == sorted(budgets) and budgets[0] < budgets[-1]
    assert budgets[-1] == fit.MAX_AUTO_TOKENS
    assert plan("qwen2.5-1.5b", 200, cap=4096).micro_batch_tokens == 4096


def test_gradient_checkpointing_and_a_4bit_base_need_less():
    plain, checkpointed = plan("qwen2.5-7b", 60), plan("qwen2.5-7b", 60, checkpointing=True)
    assert checkpointed.per_token < plain.per_token / 5
    assert checkpointed.micro_batch_tokens > plain.micro_batch_tokens
    four_bit = plan("qwen2.5-7b", 60, quantization="4bit")
    assert four_bit.weights < plain.weights / 2  # the embeddings and output layer stay in bf16
    assert four_bit.micro_batch_tokens > plain.micro_batch_tokens


def test_a_32b_model_beside_its_inference_server_fits_only_with_a_4bit_base():
    # An H200 (140 GiB) with a 32B vLLM server (65 GiB of weights, a 16 GiB KV cache, its graphs): ~55 GiB.
    bf16, four_bit = plan("qwen2.5-32b", 55), plan("qwen2.5-32b", 55, quantization="4bit")
    assert not bf16.fits and bf16.micro_batch_tokens == 0
    assert four_bit.fits and four_bit.micro_batch_tokens >= 2048
    message = fit.refusal("qwen2.5-32b", "cuda:0", bf16, four_bit)
    assert "Training qwen2.5-32b needs about" in message and "55.0 GiB are free" in message
    assert 'train.base_quantization: "4bit"' in message and "and fits" in message
    assert "ARTWEB_VLLM_KV_CACHE_GB" in message
    # Where not even a 4-bit base fits, the message does not offer it.
    tiny = plan("qwen2.5-32b", 10, quantization="4bit")
    assert "4-bit" not in fit.refusal("qwen2.5-32b", "cuda:0", plan("qwen2.5-32b", 10), tiny)


def test_a_measured_peak_resizes_the_budget():
    # 1 GiB over the update's start for 4,096 tokens: 256 KiB a token; 8 GiB free holds 32,768, but the
    # budget grows at most to twice what was measured; less room than that is what limits it.
    assert fit.measured_budget(peak_over_base=GiB, tokens=4096, room=8 * GiB, cap=65536) == 2 * 4096
    assert fit.measured_budget(peak_over_base=GiB, tokens=16384, room=8 * GiB, cap=65536) == 32768
    assert fit.measured_budget(peak_over_base=GiB, tokens=4096, room=GiB + GiB // 2, cap=65536) == 6144
    assert fit.measured_budget(peak_over_base=GiB, tokens=16384, room=8 * GiB, cap=16384) == 16384
    # Never below the least a run starts with, nor above the cap when nothing was measured.
    assert fit.measured_budget(peak_over_base=GiB, tokens=1024, room=GiB // 100, cap=65536) == fit.MIN_FIT_TOKENS
    assert fit.measured_budget(peak_over_base=0, tokens=0, room=GiB, cap=65536) == 65536


def test_the_budget_leaves_room_for_its_own_output_workspace():
    """Seen on an H100: a small update of the default model (49,152-token vocabulary) measured its
    activations, and the budget it set ran out of memory at the next update, whose logits workspace had
    grown to a whole chunk (3 GiB). The budget now pays for the workspace of its own size."""
    vocab, per_token = 49152, 1 << 20  # 1 MiB of activations a token
    room, measured = 12 * GiB, 4608  # 4,608 tokens' logits: 0.84 of a chunk
    budget = fit.measured_budget(
        peak_over_base=measured * per_token, tokens=measured, room=room, cap=65536, vocab=vocab
    )
    assert budget == 9216  # (12 GiB - a whole chunk's 3 GiB) / 1 MiB
    assert per_token * budget + fit.workspace_bytes(vocab, budget) <= room
    assert budget < (room - fit.workspace_bytes(vocab, measured)) / per_token  # what the measured one implied
    # A budget whose logits stay under one chunk pays for them by the token.
    small = fit.measured_budget(peak_over_base=900 * per_token, tokens=900, room=2 * GiB, cap=65536, vocab=vocab)
    assert vocab * small <= fit.CHUNK_ELEMENTS
    assert per_token * small + fit.workspace_bytes(vocab, small) <= 2 * GiB
    assert per_token * (small + 256) + fit.workspace_bytes(vocab, small + 256) > 2 * GiB


def test_a_config_without_the_sizes_is_refused_by_name():
    with pytest.raises(ValueError, match="config.json lacks a size"):
        fit.ModelShape.from_config({"model_type": "mystery"})
    multimodal = {"text_config": json.loads((SHAPES / "qwen2.5-1.5b" / "config.json").read_text())}
    assert fit.ModelShape.from_config(multimodal) == shape("qwen2.5-1.5b")


def test_the_model_config_is_read_from_the_directory(tiny_model_dir, tmp_path):
    assert fit.read_model_config(str(tiny_model_dir))["vocab_size"] > 0
    assert fit.read_model_config(str(tmp_path)) == {}
    (tmp_path / "config.json").write_text("[1, 2")
    assert fit.read_model_config(str(tmp_path)) == {}


def test_on_the_cpu_the_budget_is_the_default_and_nothing_is_checked(tiny_model_dir):
    assert TrainConfig().micro_batch_tokens is None
    trainer = make_trainer(TrainConfig(dtype="float32"), base_model_path=str(tiny_model_dir), device="cpu")
    assert trainer.micro_batch_tokens == fit.CPU_DEFAULT_TOKENS
    assert fit.check_before_load(TrainConfig(), str(tiny_model_dir), "cpu") is None
    assert make_trainer(TrainConfig(micro_batch_tokens=512), str(tiny_model_dir)).micro_batch_tokens == 512


def test_a_4bit_base_is_refused_on_a_cpu_worker(tiny_model_dir, settings):
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        make_trainer(TrainConfig(base_quantization="4bit"), str(tiny_model_dir), device="cpu").load()
    settings.ARTWEB = {**settings.ARTWEB, "DEVICE": "cpu"}
    with pytest.raises(Exception, match='base_quantization "4bit" needs a GPU worker'):
        run_config_parse({"train": {"base_quantization": "4bit"}})
    settings.ARTWEB = {**settings.ARTWEB, "DEVICE": "cuda"}
    assert run_config_parse({"train": {"base_quantization": "4bit"}}).train["base_quantization"] == "4bit"
