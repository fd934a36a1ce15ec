"""What the GPU benchmarks are fed, checked where no GPU is needed (these run on the CPU machines too):
the model shapes of `bench.gpu_shapes` are the public models' architectures, its reward tells a random
model's answers apart (where the example's reward cannot), and `bench.trl_grpo` configures TRL for a GPU
as `bench.gpu_trl_compare` asks it to.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SHAPES = REPO / "bench" / "shapes"

# Parameter counts Qwen publishes for Qwen2.5-0.5B and Qwen2.5-1.5B (embeddings tied to the output layer).
PUBLISHED_PARAMETERS = {"qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304}


@pytest.mark.parametrize("shape", sorted(PUBLISHED_PARAMETERS))
def test_each_shape_builds_the_public_models_architecture(shape):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(SHAPES / shape)
    with torch.device("meta"):  # no memory, no weights: only the architecture
        model = AutoModelForCausalLM.from_config(config)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED_PARAMETERS[shape]
    assert config.tie_word_embeddings and config.vocab_size == 151_936


class _Trajectory:
    def __init__(self, answer: str):
        self._messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": answer}]
        self.metrics: dict = {}

    def messages(self) -> list[dict]:
        return self._messages


def _load(path: Path):
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace["reward"]


def _noise(rng: random.Random, n: int = 400) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJ0123456789 .,;:!?-_()[]{}<>@#$%^&*"
    return "".join(rng.choice(alphabet) for _ in range(n))


def test_the_shapes_reward_tells_noisy_answers_apart_where_the_examples_cannot():
    rng = random.Random(0)
    lines = (REPO / "rollouts" / "examples" / "scenarios.jsonl").read_text().splitlines()
    scenarios = [SimpleNamespace(**json.loads(line)) for line in lines[:16]]
    example = _load(REPO / "rollouts" / "examples" / "reward.py")
    shapes = _load(SHAPES / "reward.py")

    for scenario in scenarios:  # a step: 16 groups of 8 answers of a random-weight model
        answers = [_noise(rng, rng.randint(300, 500)) for _ in range(8)]
        example_scores = {example(_Trajectory(a), scenario) for a in answers}
        shapes_scores = [shapes(_Trajectory(a), scenario) for a in answers]
        assert len(example_scores) == 1  # one value for the whole group: zero advantages, nothing trained
        assert len(set(shapes_scores)) > 1  # the group's rewards differ: every group trains
        assert all(0.0 <= s <= 1.0 for s in shapes_scores)
    scenario = scenarios[0]
    assert shapes(_Trajectory(""), scenario) == 0.0
    assert shapes(_Trajectory("abc"), scenario) == 1.0


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))],
)
def test_trl_is_configured_as_the_gpu_comparison_asks(tmp_path, device):
    pytest.importorskip("trl")  # the bench extra
    from bench.trl_grpo import grpo_config

    args = argparse.Namespace(
        steps=10,
        seed=0,
        group_size=6,
        scenarios_per_step=4,
        max_tokens=48,
        learning_rate=2e-4,
        device=device,
        dtype="auto",
        gradient_checkpointing="off",
        generation="vllm-colocate",
        vllm_memory=0.25,
        micro_batch=8,
    )
    config = grpo_config(args, tmp_path)
    assert config.use_cpu == (device == "cpu")
    if device == "cuda":
        assert config.bf16 and config.model_init_kwargs["dtype"] == torch.bfloat16
    assert config.use_vllm and config.vllm_mode == "colocate" and config.vllm_gpu_memory_utilization == 0.25
    assert config.gradient_checkpointing is False  # artweb's engine's default; TRL's is on
    assert (config.loss_type, config.epsilon_high, config.beta) == ("cispo", 5.0, 0.0)
    assert config.num_generations == 6 and config.generation_batch_size == 24  # the whole step generated at once
    # ... and trained in micro-batches of 8 sequences whose gradients are accumulated into one optimizer step
    assert (config.per_device_train_batch_size, config.gradient_accumulation_steps) == (8, 3)
