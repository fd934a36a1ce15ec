"""Fold a PEFT LoRA adapter into its base model's weights: W' = W + scale · B·A per adapted layer.

vLLM's CPU build serves LoRA through unfused PyTorch ops and turns graph compilation off whenever LoRA
is enabled, so a step's adapter runs at a fraction of the base model's speed. Serving the merged
weights instead keeps the compiled base-model path; `VLLMServer` reloads them in place each step.
torch and safetensors are imported lazily: only the worker that owns the inference server merges.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

WEIGHT_FILE = "model.safetensors"


class MergeError(ValueError):
    pass


def _adapter_config(adapter_dir: Path) -> dict:
    try:
        config = json.loads((adapter_dir / "adapter_config.json").read_text())
    except FileNotFoundError as exc:
        raise MergeError(f"{adapter_dir} has no adapter_config.json: is it a PEFT LoRA adapter?") from exc
    if config.get("peft_type", "LORA") != "LORA" or config.get("use_dora"):
        raise MergeError("Only plain LoRA adapters can be merged (not DoRA or other PEFT types).")
    if config.get("modules_to_save"):
        raise MergeError("Adapters with modules_to_save cannot be merged into the served weights.")
    return config


def _scale(config: dict, module: str, rank: int) -> float:
    alpha = config.get("lora_alpha", rank)
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if module == pattern or module.endswith("." + pattern):
            alpha = value
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def read_adapter(adapter_dir: str | os.PathLike) -> dict:
    """The adapter in adapter_dir as base weight name -> (A (r, in), B (out, r), scale), in float32."""
    import torch
    from safetensors import safe_open

    adapter_dir = Path(adapter_dir)
    config = _adapter_config(adapter_dir)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    with safe_open(str(adapter_dir / "adapter_model.safetensors"), framework="pt") as fh:
        for key in fh.keys():
            # "base_model.model.<module>.lora_A.weight" (an adapter name may follow lora_A in older files)
            module, _, rest = key.partition(".lora_")
            if not rest:
                continue
            module = module.removeprefix("base_model.model.")
            pairs.setdefault(f"{module}.weight", {})[rest[0]] = fh.get_tensor(key).float()
    lora = {}
    for key, pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise MergeError(f"{key.removesuffix('.weight')} has lora_{next(iter(pair))} but not its pair")
        a, b = pair["A"], pair["B"]
        lora[key] = (a, b, _scale(config, key.removesuffix(".weight"), a.shape[0]))
    return lora


def fold(target, base, layer: tuple) -> None:
    """target (a float32 tensor of base's shape) = base + scale · B·A, accumulated in one pass."""
    a, b, scale = layer
    target.copy_(base).addmm_(b, a, alpha=scale)


def merge_state(base: dict, adapter_dir: str | os.PathLike, *, dtype=None) -> dict:
    """base (name -> tensor) with the adapter in adapter_dir folded in: W + scale · B·A, each delta computed
    in float32. Tensors keep their dtype, or become `dtype` when one is given."""
    import torch

    lora = read_adapter(adapter_dir)
    merged: dict[str, torch.Tensor] = {}
    for key, tensor in base.items():
        target = dtype or tensor.dtype
        layer = lora.pop(key, None)
        if layer is not None:
            # A float32 copy (never the base's own tensor) with the product accumulated into it.
            folded = torch.empty(tensor.shape, dtype=torch.float32)
            fold(folded, tensor, layer)
            tensor = folded
        merged[key] = tensor.to(target).contiguous()
    if lora:
        raise MergeError(f"Adapter layers with no matching base weight: {sorted(lora)[:5]}")
    return merged


def merge_adapter(base_dir: str | os.PathLike, adapter_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write base + adapter as one safetensors file in out_dir (created); return out_dir.

    Base tensors keep their dtype; each delta is computed in float32 before the cast, so a small
    update is not lost to bf16 rounding of the product.
    """
    from safetensors.torch import load_file, save_file

    base_dir, out_dir = Path(base_dir), Path(out_dir)
    base = {}
    for weights_file in sorted(base_dir.glob("*.safetensors")):
        base.update(load_file(str(weights_file)))
    merged = merge_state(base, adapter_dir)

    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / (WEIGHT_FILE + ".part")
    save_file(merged, str(tmp), metadata={"format": "pt"})
    tmp.rename(out_dir / WEIGHT_FILE)
    # vLLM resolves a weights directory like a model directory, so give it the base model's config.
    for name in ("config.json", "generation_config.json"):
        if (base_dir / name).exists() and not (out_dir / name).exists():
            (out_dir / name).write_bytes((base_dir / name).read_bytes())
    return out_dir
