"""Fixtures of the engine tests: the default model's tokenizer, a tiny random-weight Llama that uses it,
and trajectory builders. The tiny model keeps every test but the learning test fast on two CPU cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]


def data_dir() -> Path:
    return Path(os.environ.get("ARTWEB_DATA_DIR", REPO / "data"))


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    from training.engine.default_model import ensure_default_model

    return ensure_default_model(data_dir()).path


@pytest.fixture(scope="session")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A 2-layer Llama with random weights and the default model's tokenizer and chat template."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer.save_pretrained(path)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        LlamaForCausalLM(config).save_pretrained(path)
    return path


def completion(tokenizer, text: str, logprob: float = -10.8) -> dict:
    """An assistant turn as the sampler returns it: token ids ending in <|im_end|>, one logprob each."""
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    return {"role": "assistant", "content": text, "token_ids": ids, "logprobs": [logprob] * len(ids)}


def trajectory(tokenizer, prompt: str, answer: str, reward: float | None, logprob: float = -10.8) -> dict:
    return {
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": prompt},
            completion(tokenizer, answer, logprob),
        ],
        "tools": None,
        "reward": reward,
    }


@pytest.fixture
def make_trajectory(tokenizer):
    return lambda prompt, answer, reward, logprob=-10.8: trajectory(tokenizer, prompt, answer, reward, logprob)
