"""The inference server's KV cache: the operator's setting, the CPU's size, or on a GPU sized from the
model's shape for the run that starts the server, in the card's free memory.

The GPU's free memory is the one thing faked here (no GPU on these machines): torch.cuda.mem_get_info
answers with an 80 GB card's figures; the sizing around it is the real code."""

import json
from pathlib import Path

import pytest

from artweb.testing.factories import BaseModelFactory, RunFactory
from training.engine import fit
from training.services import inference

pytestmark = pytest.mark.django_db

SHAPES = Path(__file__).resolve().parents[2] / "bench" / "shapes"
GiB = fit.GiB


def shape(name: str) -> fit.ModelShape:
    return fit.ModelShape.from_config(json.loads((SHAPES / name / "config.json").read_text()))


def test_the_cache_holds_the_rollouts_in_flight_with_headroom():
    qwen7b = shape("qwen2.5-7b")  # 28 layers x 4 KV heads x 128: 56 KiB a token
    assert qwen7b.kv_bytes_per_token() == 2 * 28 * 4 * 128 * 2
    size = fit.kv_cache_gib(qwen7b, sequences=128, tokens=560, free=79 * GiB, trainer=30 * GiB)
    wanted = qwen7b.kv_bytes_per_token() * 128 * 560 * fit.KV_CACHE_HEADROOM / GiB
    assert size == pytest.approx(wanted, abs=0.1) and size > fit.KV_CACHE_MIN_GIB  # 4.8 GiB, not 2
    # Short of memory, it takes what is left; never less than the old fixed size.
    assert fit.kv_cache_gib(qwen7b, sequences=512, tokens=4096, free=79 * GiB, trainer=30 * GiB) < 79 - 30 - 15
    assert fit.kv_cache_gib(qwen7b, sequences=128, tokens=560, free=40 * GiB, trainer=30 * GiB) == 2.0


@pytest.fixture
def gpu_worker(settings, monkeypatch):
    settings.ARTWEB = {
        **settings.ARTWEB,
        "DEVICE": "cuda:0",
        "TRAINER_BACKEND": "unsloth",  # a GPU worker's
        "VLLM_KV_CACHE_GB": None,
        "VLLM_CUDA_DEVICES": "",
    }
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (79 * GiB, 80 * GiB))  # see the docstring
    return settings


def test_a_run_on_a_gpu_sizes_the_cache_from_its_rollouts(gpu_worker, tmp_path):
    model_dir = tmp_path / "qwen7b"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((SHAPES / "qwen2.5-7b" / "config.json").read_text())
    base = BaseModelFactory(local_path=str(model_dir), max_length=4096)
    small = RunFactory(base_model=base, config={"group_size": 8, "scenarios_per_step": 2, "max_tokens": 48})
    big = RunFactory(
        base_model=base,
        config={"group_size": 8, "scenarios_per_step": 16, "max_tokens": 512, "concurrency": 128},
    )
    small_gb, big_gb = inference.kv_cache_for(base, small), inference.kv_cache_for(base, big)
    assert small_gb == fit.KV_CACHE_MIN_GIB  # 16 rollouts of 560 tokens need less than the floor
    per_rollout = shape("qwen2.5-7b").kv_bytes_per_token() * (512 + inference.PROMPT_TOKENS)
    assert big_gb == pytest.approx(128 * per_rollout * fit.KV_CACHE_HEADROOM / GiB, abs=0.1)
    assert inference.kv_cache_for(base) == fit.KV_CACHE_MIN_GIB  # no run (a dry run, the endpoint)


def test_the_operators_setting_and_the_cpu_size_win(settings, tmp_path):
    base = BaseModelFactory(local_path=str(tmp_path))
    run = RunFactory(base_model=base)
    settings.ARTWEB = {**settings.ARTWEB, "DEVICE": "cuda:0", "VLLM_KV_CACHE_GB": 16.0}
    assert inference.kv_cache_for(base, run) == 16.0
    settings.ARTWEB = {**settings.ARTWEB, "DEVICE": "cpu", "VLLM_KV_CACHE_GB": None}
    assert inference.kv_cache_for(base, run) == inference.CPU_KV_CACHE_GB
    # A GPU worker that cannot read the model's shape keeps the old fixed size.
    settings.ARTWEB = {**settings.ARTWEB, "DEVICE": "cuda:0"}
    assert inference.kv_cache_for(base, run) == fit.KV_CACHE_MIN_GIB
