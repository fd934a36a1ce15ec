"""A step's policy copied into a running vLLM server's weights on the GPU, with nothing written to disk.

A server that holds one policy at a time ("merged" mode) otherwise loads each policy from a merged copy on
disk (rollouts.inference.merge): at 7B that is 15 GB written and read back per policy. When the worker's
trainer holds the same base weights on the same GPU, the merged weights (base + scale · B·A, computed in
float32 as merge.fold does, then cast to the base's dtype) are instead computed there, a chunk at a time,
and handed to vLLM through CUDA IPC: vLLM's weight-update routes (/start_weight_update, /update_weights,
/finish_weight_update) with the engine of rollouts.inference.vllm_weights, which copies them into the
model's parameters. Only the weights under LoRA layers are sent; the others never change.

A tensor travels as the JSON of `tensor_handle`: the GPU's UUID, its shape and layout, and the IPC handles
torch makes for it. The sender keeps the tensor alive until the server has copied it.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rollouts.inference.merge import base_weight_of, read_adapter

# How much of the merged weights is made before the server copies it: the memory the push needs beside
# the trainer's (Qwen2.5-7B's 12 GiB of weights under LoRA layers take about 12 requests).
CHUNK_BYTES = 1 << 30
DTYPES = ("bfloat16", "float16", "float32")


def tensor_handle(tensor) -> dict[str, Any]:
    """A CUDA tensor as JSON another process on the same GPU opens with handle_fields."""
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(tensor)
    (
        _,
        size,
        stride,
        offset,
        _,
        dtype,
        device,
        handle,
        storage_bytes,
        storage_offset,
        _,
        ref,
        ref_offset,
        event,
        sync,
    ) = args
    return {
        "gpu": str(torch.cuda.get_device_properties(device).uuid),
        "size": list(size),
        "stride": list(stride),
        "offset": offset,
        "dtype": str(dtype).removeprefix("torch."),
        "handle": _b64(handle),
        "storage_bytes": storage_bytes,
        "storage_offset": storage_offset,
        "ref": _b64(ref),
        "ref_offset": ref_offset,
        "event": _b64(event),
        "event_sync": bool(sync),
    }


def handle_fields(fields: dict[str, Any], device: int) -> tuple:
    """torch's rebuild_cuda_tensor arguments for the tensor `fields` describe, opened on `device` (an index
    of the receiving process); a ValueError names a field that is missing or not of its kind."""
    import torch

    if fields.get("dtype") not in DTYPES:
        raise ValueError(f"A shared tensor's dtype, {fields.get('dtype')!r}, is not one of {DTYPES}")
    f = {key: _field(fields, key, kind) for key, kind in _KINDS.items()}
    return (
        torch.Tensor, torch.Size(f["size"]), tuple(f["stride"]), f["offset"], torch.storage.TypedStorage,
        getattr(torch, fields["dtype"]), device, f["handle"], f["storage_bytes"], f["storage_offset"], False,
        f["ref"], f["ref_offset"], f["event"], f["event_sync"],
    )  # fmt: skip


def _ints(value) -> list[int]:
    return [int(n) for n in value]


def _bytes_or_none(value) -> bytes | None:
    return None if value is None else base64.b64decode(value, validate=True)


_KINDS = {
    "size": _ints, "stride": _ints, "offset": int, "handle": base64.b64decode, "storage_bytes": int,
    "storage_offset": int, "ref": base64.b64decode, "ref_offset": int, "event": _bytes_or_none, "event_sync": bool,
}  # fmt: skip


def _field(fields: dict[str, Any], key: str, kind) -> Any:
    try:
        return kind(fields[key])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"A shared tensor's {key!r} is missing or not of its kind ({exc!r})") from exc


def _b64(value: bytes | None) -> str | None:
    return None if value is None else base64.b64encode(value).decode()


def lora_base_weights(model) -> dict[str, Any] | None:
    """The base weight under each LoRA layer of a PEFT model, by its name in the base checkpoint
    ("model.layers.0.self_attn.q_proj.weight"); None when they are not plain CUDA tensors of a float type
    (a 4-bit base, a CPU trainer): such weights are not what the server holds."""
    from peft.tuners.lora import LoraLayer

    weights = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            weight = getattr(module.get_base_layer(), "weight", None)
            if weight is None or not weight.is_cuda or str(weight.dtype).removeprefix("torch.") not in DTYPES:
                return None
            weights[f"{name.removeprefix('base_model.model.')}.weight"] = weight
    return weights or None


def adapter_layers(adapter_dir: str) -> set[str]:
    """The base weights adapter_dir changes, by name, read from its file's header alone."""
    from safetensors import safe_open

    with safe_open(f"{adapter_dir}/adapter_model.safetensors", framework="pt") as fh:
        keys = fh.keys()
    return {weight for key in keys if (weight := base_weight_of(key)) is not None}


def merged_weights(base: dict[str, Any], adapter_dir: str | None) -> Iterator[tuple[str, Any]]:
    """Every weight of `base` with the adapter in adapter_dir folded in (None: the base's own values), in
    order; each delta computed in float32 on the weight's device."""
    lora = read_adapter(adapter_dir) if adapter_dir else {}
    for key, weight in base.items():
        layer = lora.get(key)
        if layer is None:
            yield key, weight.detach()
            continue
        a, b, scale = layer
        merged = weight.detach().float().addmm_(b.to(weight.device), a.to(weight.device), alpha=scale)
        yield key, merged.to(weight.dtype)


def push(
    post: Callable[[str, dict | None], Any], weights: Iterable[tuple[str, Any]], chunk_bytes: int = CHUNK_BYTES
) -> int:
    """Copy `weights` into the server's model through `post(route, body)`, a chunk of about chunk_bytes per
    request; return how many tensors were sent. A failure midway leaves the server's weights part old,
    part new: the caller serves no policy from it until a push or a reload succeeds."""
    import torch

    post("/start_weight_update", None)
    sent, batch, size = 0, [], 0
    try:
        for name, tensor in weights:
            batch.append((name, tensor.contiguous()))
            size += tensor.nbytes
            if size >= chunk_bytes:
                sent += _send(post, batch)
                batch, size = [], 0
        if batch:
            sent += _send(post, batch)
    except BaseException:
        _finish_quietly(post)
        raise
    post("/finish_weight_update", None)
    torch.cuda.ipc_collect()
    return sent


def _send(post, batch: list) -> int:
    import torch

    torch.cuda.synchronize()  # the merges are done before the server reads them
    post(
        "/update_weights",
        {"update_info": {"names": [n for n, _ in batch], "tensors": [tensor_handle(t) for _, t in batch]}},
    )
    return len(batch)


def _finish_quietly(post) -> None:
    try:
        post("/finish_weight_update", None)
    except Exception:  # the server ended the update itself when a chunk failed there
        pass
