"""Model loaders of the two backends: base weights frozen, a fresh LoRA adapter on top.

Both return a PEFT model over a Hugging Face causal LM, so the trainer drives either the same way:
the decoder for hidden states, the output embedding for logits at trained positions only, and
`disable_adapter()` for the base model as KL reference. Unsloth is imported here, lazily, because it
patches transformers on import and needs a CUDA GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from training.engine.activations import fuse_gated_mlps
from training.engine.config import ConfigError, TrainConfig


@dataclass
class LoadedModel:
    model: Any  # peft.PeftModel over a *ForCausalLM
    tokenizer: Any


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AMX or AVX512-BF16).

    On such a CPU a bf16 matmul runs ~6x faster than fp32 (measured on 2 cores: ~1,000 vs ~170 GFLOPS);
    without them bf16 is emulated and slower than fp32.
    """
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """The base weights' dtype. "auto": bf16 on CUDA and on CPUs with bf16 units, fp32 on other CPUs."""
    if name == "auto":
        fast = str(device).startswith("cuda") or cpu_has_fast_bf16()
        return torch.bfloat16 if fast else torch.float32
    return getattr(torch, name)


def _alpha(cfg: TrainConfig) -> int | float:
    """LoRA alpha, as an int when it is one (adapter_config.json then reads like the usual ones)."""
    return int(cfg.lora_alpha) if float(cfg.lora_alpha).is_integer() else cfg.lora_alpha


def load_peft(cfg: TrainConfig, base_model_path: str, device: str, seed: int = 0) -> LoadedModel:
    """transformers + PEFT: CPU or GPU, any causal LM that transformers loads. PEFT draws the LoRA
    initialisation from torch's global generator, which the trainer seeds before calling this."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model_path)
    dtype = resolve_dtype(cfg.dtype, device)
    if cfg.base_quantization == "4bit":
        base = AutoModelForCausalLM.from_pretrained(
            base_model_path, dtype=dtype, attn_implementation="sdpa", **_four_bit(dtype, device)
        )
    else:
        base = AutoModelForCausalLM.from_pretrained(base_model_path, dtype=dtype, attn_implementation="sdpa")
        base.to(device)
    base.config.use_cache = False
    lora = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=_alpha(cfg),
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.lora_target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    # PEFT freezes the base and, with a half-precision base, keeps the adapter in fp32
    # (autocast_adapter_dtype), so small Adam updates are not rounded away.
    model = get_peft_model(base, lora)
    if str(device) == "cpu" and dtype == torch.float32:
        # Less memory kept for the backward pass, at the same speed, on CPUs without bf16 units (measured
        # there). In bf16 its float32 backward was no gain; GPU runs stay as measured.
        fuse_gated_mlps(model)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return LoadedModel(model=model, tokenizer=tokenizer)


def _four_bit(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """from_pretrained's arguments for an NF4 base on `device` (bitsandbytes; the output layer, embeddings
    and norms stay in dtype)."""
    if not str(device).startswith("cuda"):
        raise ConfigError(
            "base_quantization",
            'A 4-bit base needs a CUDA GPU (bitsandbytes); this worker trains on the CPU: use base_quantization "none".',
        )
    from transformers import BitsAndBytesConfig

    quantization = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype
    )
    return {"quantization_config": quantization, "device_map": {"": str(device)}}


def load_unsloth(cfg: TrainConfig, base_model_path: str, device: str, seed: int = 0) -> LoadedModel:
    """Unsloth's FastLanguageModel + LoRA: fused kernels and its own activation offloading; CUDA only."""
    if not str(device).startswith("cuda"):
        raise ValueError("the unsloth backend needs a CUDA device; use backend 'peft' on the CPU")
    # Unsloth fetches a usage-statistics file from the model hub on load unless told not to; a worker
    # must never depend on the internet.
    os.environ.setdefault("UNSLOTH_DISABLE_STATISTICS", "1")
    from unsloth import FastLanguageModel

    checkpointing = "unsloth" if cfg.gradient_checkpointing else False
    # fix_tokenizer=False: the tokenizer must stay exactly the one the inference server uses.
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=base_model_path,
        max_seq_length=cfg.max_seq_len,
        dtype=resolve_dtype(cfg.dtype, device),
        load_in_4bit=cfg.base_quantization == "4bit",
        load_in_8bit=False,
        full_finetuning=False,
        fix_tokenizer=False,
        use_gradient_checkpointing=checkpointing,
        random_state=seed,
    )
    model = FastLanguageModel.get_peft_model(
        model,
        r=cfg.lora_rank,
        lora_alpha=_alpha(cfg),
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.lora_target_modules),
        bias="none",
        random_state=seed,
        use_gradient_checkpointing=checkpointing,
    )
    FastLanguageModel.for_training(model)
    # Unsloth may return a processor-like wrapper; the trainer needs the text tokenizer.
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    return LoadedModel(model=model, tokenizer=tokenizer)


LOADERS = {"peft": load_peft, "unsloth": load_unsloth}
