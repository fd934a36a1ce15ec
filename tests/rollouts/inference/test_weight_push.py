"""A policy copied into a GPU server's weights from the trainer's (rollouts.inference.weight_push, vllm_weights).

The copy itself goes through CUDA IPC, which needs a GPU: tests/gpu/test_gpu_worker.py runs it against a
real vLLM server. Here, on the CPU: the weights it sends equal the merged copy written to disk, the names
it reads from an adapter, the checks on what the server is sent, the receiving engine as vLLM builds it,
and that a server of vLLM's CPU build never takes this path.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from artweb.testing.weights import make_adapter
from rollouts.inference.merge import load_base, merge_state, read_adapter
from rollouts.inference.weight_push import adapter_layers, handle_fields, lora_base_weights, merged_weights

VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    return make_adapter(tmp_path_factory.mktemp("push") / "step-1", seed=5, std=0.05)


def test_the_weights_sent_are_the_merged_copy_a_server_would_read_from_disk(vllm_model_dir, adapter):
    base = load_base(vllm_model_dir)
    layers = {key: base[key] for key in read_adapter(adapter)}  # what a trainer's LoRA layers hold
    assert len(layers) == 7 * 30  # 7 projections in each of the default model's 30 layers

    sent = dict(merged_weights(layers, str(adapter)))
    on_disk = merge_state(base, adapter)
    assert sent.keys() == layers.keys()
    for key, tensor in sent.items():
        assert tensor.dtype == base[key].dtype
        assert torch.equal(tensor, on_disk[key]), key
    assert any(not torch.equal(sent[key], base[key]) for key in sent)

    restored = dict(merged_weights(layers, None))  # back to the base model: its own values
    assert all(torch.equal(restored[key], base[key]) for key in layers)


def test_an_adapters_layers_are_read_from_its_header(adapter):
    assert adapter_layers(str(adapter)) == set(read_adapter(adapter))


def test_a_trainer_on_the_cpu_offers_no_weights_to_copy(vllm_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(vllm_model_dir), dtype=torch.bfloat16)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    assert lora_base_weights(peft_model) is None  # CUDA IPC maps GPU memory only: the disk copy is loaded


def _fields(**change) -> dict:
    fields = {
        "gpu": "GPU-1",
        "size": [2, 3],
        "stride": [3, 1],
        "offset": 0,
        "dtype": "bfloat16",
        "handle": "aGFuZGxl",
        "storage_bytes": 12,
        "storage_offset": 0,
        "ref": "cmVm",
        "ref_offset": 0,
        "event": None,
        "event_sync": False,
    }
    fields.update(change)
    return {k: v for k, v in fields.items() if v != "drop"}


def test_a_shared_tensor_is_opened_only_as_described_and_of_a_float_type():
    args = handle_fields(_fields(), device=0)
    assert args[0] is torch.Tensor and args[1] == torch.Size([2, 3]) and args[5] is torch.bfloat16
    assert args[6] == 0 and args[7] == b"handle" and args[13] is None  # opened on the receiver's own device
    with pytest.raises(ValueError, match="dtype, .int64."):
        handle_fields(_fields(dtype="int64"), device=0)
    with pytest.raises(ValueError, match="handle"):
        handle_fields(_fields(handle="drop"), device=0)
    with pytest.raises(ValueError, match="size"):
        handle_fields(_fields(size=None), device=0)


@pytest.mark.skipif(not VLLM, reason="needs vLLM")
def test_vllm_builds_the_receiving_engine_under_its_name_and_it_checks_what_it_is_sent():
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from rollouts.inference.vllm_entry import register_weight_push
    from rollouts.inference.vllm_server import PUSH_BACKEND
    from rollouts.inference.vllm_weights import SharedWeightsEngine, shared_tensor

    register_weight_push(PUSH_BACKEND)
    register_weight_push(PUSH_BACKEND)  # a forked process registers again: no error

    def engine(quantization):
        config = SimpleNamespace(parallel_config=None, model_config=SimpleNamespace(quantization=quantization))
        return WeightTransferEngineFactory.create_engine(
            WeightTransferConfig(backend=PUSH_BACKEND), config, torch.device("cpu"), torch.nn.Linear(2, 2)
        )

    assert isinstance(engine(None), SharedWeightsEngine)
    engine(None).start_weight_update()
    with pytest.raises(ValueError, match="quantized \\(fp8\\)"):
        engine("fp8").start_weight_update()
    with pytest.raises(ValueError, match="2 names for 1 tensors"):
        engine(None).parse_update_info({"names": ["a", "b"], "tensors": [_fields()]})
    with pytest.raises(ValueError, match="must share a GPU"):
        shared_tensor(_fields(gpu="GPU-other"), "GPU-1", 0)


@pytest.mark.skipif(not VLLM, reason="needs vLLM")
def test_a_server_of_vllms_cpu_build_loads_merged_copies_from_disk(vllm_model_dir):
    from rollouts.inference.vllm_server import VLLMServer

    asked = []
    server = VLLMServer(str(vllm_model_dir), adapter_mode="merged", weights_source=lambda *a: asked.append(a))
    if not server.cpu_build:
        pytest.skip("this machine's vLLM is the GPU build (tests/gpu covers it)")
    assert "--weight-transfer-config" not in server.command()
    assert "ARTWEB_VLLM_WEIGHT_PUSH" not in server.environment()
    assert server._push_weights("run-1@1", "/nowhere") is False and asked == []


def test_a_copy_that_fails_is_loaded_from_disk_and_never_tried_again(vllm_model_dir, caplog):
    """No CUDA here, so the copy fails as it would where the host refuses CUDA IPC; the server's routes are
    recorded instead of called (there is no GPU server to call)."""
    from rollouts.inference.vllm_server import VLLMServer

    server = VLLMServer(
        str(vllm_model_dir),
        adapter_mode="merged",
        weights_source=lambda *a: iter([("model.layers.0.self_attn.q_proj.weight", torch.zeros(2, 2))]),
    )
    server._installed = {"cpu_build": False, "flashinfer": False}  # as a GPU build reports itself
    posted = []
    server._post = lambda route, body: posted.append(route)
    assert "--weight-transfer-config" in server.command()

    assert server._push_weights("run-1@1", None) is False  # the caller loads the merged copy from disk
    assert posted == ["/start_weight_update", "/finish_weight_update"]  # the update is closed on the server
    assert server.weights_source is None and "loading it from disk instead" in caplog.text
    assert server._push_weights("run-1@2", None) is False and len(posted) == 2
