"""The one typed config of a GRPO update: loss, optimiser, LoRA, batching, backend.

Stored with each run as JSON (`to_dict` / `from_dict`) and validated field by field on construction, so a
bad value fails when the run is created, with a message that names the field and the allowed range,
instead of deep inside a training step on a GPU worker.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

# Published clip defaults (ε_low, ε_high) of each loss, used when `epsilon` / `epsilon_high` are left None.
# CISPO: ART's defaults (lower bound 1-1.0 = 0 never binds, upper 1+4.0); PPO: the PPO paper's 0.2;
# GSPO: the GSPO paper's (3e-4, 4e-4), tiny because its ratio is a per-token geometric mean.
LOSS_CLIP_DEFAULTS: dict[str, tuple[float, float]] = {
    "cispo": (1.0, 4.0),
    "ppo": (0.2, 0.2),
    "gspo": (3e-4, 4e-4),
}

# Settings of a run that people look for here, and where they are. A run has one seed (it seeds the
# scenario sampling and the trainer alike), and its group size is how many rollouts it samples per
# scenario; the trainer takes the seed as an argument and groups of whatever size it is given.
MOVED_KEYS = {
    "seed": "set the run's `seed` (it seeds training and scenario sampling)",
    "group_size": "set the run's `group_size` (rollouts per scenario)",
}

DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class ConfigError(ValueError):
    """A config value outside its allowed set; `.field` names the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def _spec(
    default: Any,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    choices: tuple[str, ...] | None = None,
    optional: bool = False,
    integer: bool | None = None,
) -> Any:
    """A dataclass field carrying its bounds; `lo_open` makes the lower bound exclusive. Whether a
    number must be an integer is read off the default unless `integer` says it (for None defaults)."""
    if integer is None:
        integer = isinstance(default, int) and not isinstance(default, bool)
    meta = {"lo": lo, "hi": hi, "lo_open": lo_open, "choices": choices, "optional": optional, "integer": integer}
    if isinstance(default, tuple):
        return field(default_factory=lambda: default, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class TrainConfig:
    # --- where it runs -------------------------------------------------------------------------------
    # "peft": transformers + PEFT, CPU or GPU. "unsloth": Unsloth's FastLanguageModel + LoRA, GPU only.
    backend: str = _spec("peft", choices=("peft", "unsloth"))
    # Dtype of the frozen base weights. "auto": bfloat16 on CUDA; float32 on CPU, which measured faster
    # there than bfloat16 on CPUs without native bf16 matrix instructions. LoRA weights are always fp32.
    dtype: str = _spec("auto", choices=("auto", "float32", "bfloat16", "float16"))
    # Recompute activations in the backward pass: less memory, ~30% more compute. Worth it for long
    # sequences on GPU; off by default because the sequences of agent rollouts are usually short.
    gradient_checkpointing: bool = _spec(False)
    # "4bit": the trainer's copy of the base weights quantised to NF4 (QLoRA; bitsandbytes, CUDA only), about a
    # quarter of the memory of bf16, so larger models train beside the inference server, which keeps serving
    # the full-precision base. "none": the base in `dtype`.
    base_quantization: str = _spec("none", choices=("none", "4bit"))

    # --- GRPO ----------------------------------------------------------------------------------------
    # Divide each group's centred rewards by the group's standard deviation (ART's default: on).
    scale_rewards: bool = _spec(True)
    # Policy loss: "cispo" (clipped, detached importance weight times log-prob; ART's default),
    # "ppo" (clipped surrogate), "gspo" (PPO clipping on the sequence-level geometric-mean ratio).
    loss: str = _spec("cispo", choices=tuple(LOSS_CLIP_DEFAULTS))
    # Lower clip: the ratio is clipped below at 1 - epsilon. None: the loss's published default.
    epsilon: float | None = _spec(None, lo=0.0, hi=1.0, lo_open=True, optional=True)
    # Upper clip: the ratio is clipped above at 1 + epsilon_high. None: the loss's published default.
    epsilon_high: float | None = _spec(None, lo=0.0, hi=100.0, lo_open=True, optional=True)
    # "token": mean over every trained token of the batch (long answers weigh more; ART's choice).
    # "sequence": mean over tokens within each sequence, then over sequences (GRPO paper, GSPO).
    loss_aggregation: str = _spec("token", choices=("token", "sequence"))
    # β of the KL(policy ‖ base) penalty, k3 estimator; the base is the same weights, adapter off.
    # 0 skips the extra reference forward pass entirely.
    kl_beta: float = _spec(0.0, lo=0.0, hi=10.0)
    # Longest token sequence trained; longer trajectories are cut at the end and counted.
    max_seq_len: int = _spec(4096, lo=16, hi=262144)

    # --- optimiser (AdamW on the LoRA weights) -------------------------------------------------------
    learning_rate: float = _spec(5e-6, lo=0.0, hi=1.0, lo_open=True)
    # "constant" (default), or "linear" / "cosine" decay to 0 at `total_steps`; all after the warmup.
    lr_scheduler: str = _spec("constant", choices=("constant", "linear", "cosine"))
    # Updates over which the learning rate rises linearly from 0.
    warmup_steps: int = _spec(0, lo=0, hi=1_000_000)
    # Length of a decaying schedule, in updates; required by "linear" and "cosine", unused otherwise.
    total_steps: int | None = _spec(None, lo=1, hi=10_000_000, optional=True, integer=True)
    adam_beta1: float = _spec(0.9, lo=0.0, hi=0.9999)
    adam_beta2: float = _spec(0.99, lo=0.0, hi=0.99999)
    adam_epsilon: float = _spec(1e-8, lo=0.0, hi=1e-2, lo_open=True)
    weight_decay: float = _spec(0.1, lo=0.0, hi=1.0)
    # Clip the global gradient norm to this value; 0 disables clipping (the norm is still reported).
    max_grad_norm: float = _spec(0.1, lo=0.0, hi=1e6)

    # --- LoRA ----------------------------------------------------------------------------------------
    lora_rank: int = _spec(8, lo=1, hi=1024)
    lora_alpha: float = _spec(16.0, lo=0.0, hi=4096.0, lo_open=True)
    lora_dropout: float = _spec(0.0, lo=0.0, hi=0.9)
    # Module names LoRA wraps; the defaults are the attention and MLP projections of Llama/Qwen-style
    # models, all of which vLLM serves as LoRA targets.
    lora_target_modules: tuple[str, ...] = _spec(DEFAULT_LORA_TARGETS)

    # --- batching ------------------------------------------------------------------------------------
    # Token budget of one micro-batch: the positions of its packed row, each group's shared prompt
    # counted once (rows × longest row where micro-batches are padded: the unsloth backend). Gradients
    # of the micro-batches of one update are accumulated, so this trades memory for speed, not results.
    # None (the default): sized by the worker. On a GPU from the model's shape and the memory left beside the
    # inference server, then from the first update's measured peak (training.engine.fit); on a CPU 8,192.
    micro_batch_tokens: int | None = _spec(None, lo=16, hi=1 << 24, optional=True, integer=True)
    # Report the mean entropy of the policy on trained tokens (one softmax more per micro-batch).
    compute_entropy: bool = _spec(True)

    def __post_init__(self) -> None:
        if isinstance(self.lora_target_modules, list):
            self.lora_target_modules = tuple(self.lora_target_modules)
        for f in fields(self):
            _check_field(f, getattr(self, f.name))
        if self.lr_scheduler != "constant" and self.total_steps is None:
            raise ConfigError(
                "total_steps",
                f"total_steps is required when lr_scheduler is '{self.lr_scheduler}': an integer in [1, 10000000]",
            )

    def clip_range(self) -> tuple[float, float]:
        """(ε_low, ε_high) in force: the configured values, or the loss's published defaults."""
        lo, hi = LOSS_CLIP_DEFAULTS[self.loss]
        return (lo if self.epsilon is None else self.epsilon, hi if self.epsilon_high is None else self.epsilon_high)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["lora_target_modules"] = list(self.lora_target_modules)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        for key in unknown:
            if key in MOVED_KEYS:
                raise ConfigError(key, f"{key} belongs to the run, not to its training settings: {MOVED_KEYS[key]}")
        if unknown:
            raise ConfigError(unknown[0], f"unknown config key(s) {unknown}; allowed keys: {sorted(known)}")
        return cls(**data)


def _check_field(f: Any, value: Any) -> None:
    """Raise ConfigError unless value has the field's type and lies within its bounds."""
    meta, name = f.metadata, f.name
    if value is None and meta.get("optional"):
        return
    default = f.default if f.default is not MISSING else f.default_factory()
    if meta.get("choices"):
        if value not in meta["choices"]:
            raise ConfigError(name, f"{name} must be one of {list(meta['choices'])}, got {value!r}")
        return
    if isinstance(default, tuple):
        if not value or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(name, f"{name} must be a non-empty list of module names, got {value!r}")
        return
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(name, f"{name} must be true or false, got {value!r}")
        return
    want_int = meta["integer"]
    ok_type = isinstance(value, int) if want_int else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or (not want_int and not math.isfinite(value)):
        kind = "an integer" if want_int else "a finite number"
        raise ConfigError(name, f"{name} must be {kind}, got {value!r}")
    lo, hi, lo_open = meta["lo"], meta["hi"], meta["lo_open"]
    if (value <= lo if lo_open else value < lo) or value > hi:
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise ConfigError(name, f"{name} must be in {interval}, got {value!r}")
