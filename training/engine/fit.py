"""How much device memory an update needs, from the model's shape, and the micro-batch that fits.

A GPU worker trains beside its inference server, so what is left for training depends on the card, the
server's KV cache and the model. The update's memory is four parts: the frozen base weights, the LoRA
weights with their gradients and AdamW moments (fp32), the output layer's chunked log-softmax workspace
(`logprobs.CHUNK_ELEMENTS`), and activations kept for the backward, which grow with the tokens of a
micro-batch. The first three are fixed for a run; the last sets the micro-batch budget.

Activation bytes per token per layer were fitted to the updates measured on an H200 (a Qwen2.5-7B shape,
bf16, no gradient checkpointing: 8,192-token micro-batches peaked at 46.2 GiB and 32,768-token ones at
104 GiB, 2.4 MB a token more), with a margin for the peft backend, which has no fused kernels. The
estimate only has to be close: after the first update the trainer measures its own peak
(`measured_budget`), and an update that still runs out of memory halves its budget and starts again.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.engine.logprobs import CHUNK_ELEMENTS

GiB = 1 << 30
# The smallest micro-batch a run is allowed to start with: shorter than the sequences of most agent
# rollouts would be trained one piece at a time, and a model that leaves less than this much room is refused.
MIN_FIT_TOKENS = 1024
# A budget sized from memory is capped here: past it a micro-batch is no faster a token.
MAX_AUTO_TOKENS = 65536
# The budget where nothing is sized (the CPU, where memory is the machine's and measured separately).
CPU_DEFAULT_TOKENS = 8192
# A measured update sets the next budget to at most this many times its largest micro-batch.
GROWTH = 2
# Kept free beside the estimate: the CUDA context, the allocator's fragmentation, the optimizer step's
# temporaries.
MARGIN_BYTES = int(1.5 * GiB)
MARGIN_SHARE = 0.12
# Bytes per stored weight of a 4-bit (NF4, double-quantised) linear layer: half a byte and its scales.
NF4_BYTES = 0.53
# The sequence length the estimate plans the peft backend's attention for (at most the run's max_seq_len):
# longer sequences are rarer than this budget is short, and the first update's peak resizes it anyway.
ATTENTION_SPAN = 2048


@dataclass(frozen=True)
class ModelShape:
    """What the memory estimate needs of a causal LM's config.json."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    experts: int = 1
    active_experts: int = 1

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        """From config.json's keys (a multimodal model's text_config when it has one)."""
        c = config.get("text_config") or config
        try:
            hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
            experts = int(c.get("num_local_experts") or c.get("num_experts") or 1)
            return cls(
                hidden=hidden,
                layers=int(c["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(c.get("num_key_value_heads") or heads),
                head_dim=int(c.get("head_dim") or hidden // heads),
                intermediate=int(c.get("moe_intermediate_size") or c["intermediate_size"]),
                vocab=int(c["vocab_size"]),
                tied=bool(config.get("tie_word_embeddings", c.get("tie_word_embeddings", False))),
                experts=experts,
                active_experts=int(c.get("num_experts_per_tok") or 1) if experts > 1 else 1,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"config.json lacks a size the memory estimate needs ({exc})") from exc

    def _module_dims(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each projection of one layer, by the usual Llama/Qwen module names."""
        q, kv, h, i = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden, self.intermediate
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def linear_parameters(self) -> int:
        """Weights of the decoder layers' projections (what a 4-bit base quantises)."""
        dims = self._module_dims()
        attention = sum(
            a * b for name, (a, b) in dims.items() if name.endswith(("q_proj", "k_proj", "v_proj", "o_proj"))
        )
        mlp = sum(a * b for name, (a, b) in dims.items() if name in ("gate_proj", "up_proj", "down_proj"))
        return self.layers * (attention + mlp * self.experts)

    def other_parameters(self) -> int:
        """Embeddings, the output layer unless tied, and the norms: kept in 16 bits by a 4-bit base."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + (2 * self.layers + 1) * self.hidden

    def parameters(self) -> int:
        return self.linear_parameters() + self.other_parameters()

    def lora_parameters(self, rank: int, targets: tuple[str, ...]) -> int:
        dims = self._module_dims()
        per_layer = sum(rank * (a + b) for name, (a, b) in dims.items() if name in targets)
        return self.layers * per_layer

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """The inference server's KV cache for one token of one sequence."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


@dataclass(frozen=True)
class MemoryPlan:
    """An update's memory, in bytes, and the micro-batch budget that fits what is available."""

    weights: int
    lora_state: int
    workspace: int
    per_token: int
    available: int
    micro_batch_tokens: int

    @property
    def fixed(self) -> int:
        return self.weights + self.lora_state + self.workspace + _margin(self.available)

    def need(self, tokens: int) -> int:
        return self.fixed + self.per_token * tokens

    @property
    def fits(self) -> bool:
        return self.micro_batch_tokens >= MIN_FIT_TOKENS


def _margin(available: int) -> int:
    return MARGIN_BYTES + int(MARGIN_SHARE * max(available, 0))


def activation_bytes_per_token(
    shape: ModelShape, *, backend: str, checkpointing: bool, dtype_bytes: int, span: int = 0
) -> int:
    """Activations an update keeps per token for its backward (see the module docstring for the fit).

    span: the longest sequence's tokens, for the peft backend, whose masked attention keeps each query's
    fp32 weights over its sequence (heads x span a token and layer; measured on an H100 with the default
    model: about 2 MB a token against 0.5 MB without this term). Unsloth's kernels keep none."""
    h, i, kv = shape.hidden, shape.intermediate * shape.active_experts, shape.kv_heads * shape.head_dim
    per_layer = (4 * h + 1.5 * i + kv) if backend == "unsloth" else (6 * h + 3 * i + 2 * kv)
    per_layer *= dtype_bytes
    if backend != "unsloth":
        per_layer += 2 * 4 * shape.heads * span  # the weights and their gradient, fp32
    if checkpointing:  # each layer's input is kept; one layer at a time is recomputed in full
        return int(dtype_bytes * shape.layers * h + per_layer)
    return int(shape.layers * per_layer)


def plan(
    shape: ModelShape,
    *,
    available: int,
    backend: str,
    dtype_bytes: int,
    quantization: str,
    lora_rank: int,
    lora_targets: tuple[str, ...],
    checkpointing: bool,
    cap: int = MAX_AUTO_TOKENS,
    span: int = 0,
) -> MemoryPlan:
    """The memory of an update of this model and the largest micro-batch (a multiple of 256 tokens, at
    most cap) that fits `available` bytes; micro_batch_tokens is 0 when not even MIN_FIT_TOKENS do."""
    if quantization == "4bit":
        weights = int(shape.linear_parameters() * NF4_BYTES) + shape.other_parameters() * 2
    else:
        weights = shape.parameters() * dtype_bytes
    # fp32 weights, gradients and AdamW's two moments
    lora_state = shape.lora_parameters(lora_rank, lora_targets) * 4 * 4
    # one chunk of fp32 logits, its log-softmax and probabilities
    workspace = workspace_bytes(shape.vocab, cap)
    per_token = activation_bytes_per_token(
        shape, backend=backend, checkpointing=checkpointing, dtype_bytes=2, span=min(span, ATTENTION_SPAN)
    )
    room = available - weights - lora_state - workspace - _margin(available)
    tokens = min(cap, max(room, 0) // per_token) // 256 * 256
    return MemoryPlan(
        weights=weights,
        lora_state=lora_state,
        workspace=workspace,
        per_token=per_token,
        available=available,
        micro_batch_tokens=int(tokens) if tokens >= MIN_FIT_TOKENS else 0,
    )


def workspace_bytes(vocab: int, tokens: int) -> int:
    """The output layer's workspace for a micro-batch of `tokens`: one fp32 chunk of logits, its log-softmax
    and probabilities, at most CHUNK_ELEMENTS each (a small micro-batch's chunk is all of its logits)."""
    return 3 * 4 * min(CHUNK_ELEMENTS, vocab * max(tokens, 1))


def measured_budget(*, peak_over_base: int, tokens: int, room: int, cap: int, vocab: int = 0) -> int:
    """The budget an update's own peak says fits: peak_over_base bytes (workspace aside) went to a
    micro-batch of `tokens` on top of what the trainer held before the update, and `room` bytes are free for
    the next updates' activations and workspace. The workspace grows with the micro-batch up to a chunk (a
    600-token micro-batch of a 49k vocabulary uses a ninth of a chunk), so the budget leaves room for the
    workspace of its own size, not the measured one's. Rounded down to 256 tokens, within
    [MIN_FIT_TOKENS, cap] and at most GROWTH times the measured micro-batch: memory is not linear in
    tokens far from where it was measured (on an H100 the peft backend's packed rows, measured at 600
    tokens, ran out of memory at the 6,656 a straight line allowed), so the budget grows by steps, each
    update measuring the next, and an update that still runs out halves it (the trainer's backstop)."""
    if tokens <= 0 or peak_over_base <= 0:
        return cap
    per_token = peak_over_base / tokens
    budget = room / (per_token + 12 * vocab)  # while its logits are less than one chunk
    if vocab * budget > CHUNK_ELEMENTS:
        budget = (room - workspace_bytes(vocab, CHUNK_ELEMENTS)) / per_token
    budget = min(budget, GROWTH * tokens)
    return int(max(MIN_FIT_TOKENS, min(cap, budget)) // 256 * 256)


def gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def refusal(name: str, device: str, memory: MemoryPlan, four_bit: MemoryPlan | None) -> str:
    """What a user reads when a run's model cannot be trained beside the inference server."""
    parts = [
        f"Training {name} needs about {gib(memory.need(MIN_FIT_TOKENS))} of {device} memory (base weights "
        f"{gib(memory.weights)}, LoRA and optimizer {gib(memory.lora_state)}, activations for "
        f"{MIN_FIT_TOKENS:,} tokens {gib(memory.per_token * MIN_FIT_TOKENS)}); {gib(memory.available)} are free "
        "beside the inference server."
    ]
    if four_bit is not None and four_bit.fits:
        parts.append(
            f'A 4-bit base (train.base_quantization: "4bit") needs about {gib(four_bit.need(MIN_FIT_TOKENS))} and fits.'
        )
    parts.append(
        "A smaller model would fit, or more memory for training: a smaller KV cache for the inference server "
        "(ARTWEB_VLLM_KV_CACHE_GB) or the inference server on a GPU of its own (ARTWEB_VLLM_CUDA_DEVICES)."
    )
    return " ".join(parts)


# The inference server's KV cache on a GPU when nothing sizes it (and never less): what every earlier
# release started with.
KV_CACHE_MIN_GIB = 2.0
# Room in the KV cache beyond the run's rollouts in flight x their tokens: vLLM's block rounding and
# another request (an endpoint or playground call) beside a step's rollouts.
KV_CACHE_HEADROOM = 1.25
# The update a KV cache sized beside the trainer leaves room for (tokens of one micro-batch).
TRAINER_RESERVE_TOKENS = 4096


def kv_cache_gib(shape: ModelShape, *, sequences: int, tokens: int, free: int, trainer: int) -> float:
    """The KV cache (GiB, one decimal) for `sequences` rollouts in flight of up to `tokens` tokens each, in the
    `free` bytes of the server's GPU, leaving its weights (bf16) and `trainer` bytes (0 when the trainer is on
    another card). Never less than KV_CACHE_MIN_GIB; less than asked when memory is short."""
    wanted = shape.kv_bytes_per_token() * sequences * tokens * KV_CACHE_HEADROOM
    room = free - shape.parameters() * 2 - trainer - _margin(free)
    return max(KV_CACHE_MIN_GIB, math.floor(min(wanted, max(room, 0)) / GiB * 10) / 10)


class TrainerDoesNotFit(RuntimeError):
    """The run's model cannot be trained in the memory its device has left; the message says what would."""


def _dtype_bytes(cfg: Any, device: str) -> int:
    from training.engine.backends import resolve_dtype

    return resolve_dtype(cfg.dtype, device).itemsize


def plan_for(cfg: Any, shape: ModelShape, available: int, device: str, quantization: str | None = None) -> MemoryPlan:
    """plan() with a TrainConfig's settings (quantization: another than the config's, for the refusal)."""
    return plan(
        shape,
        available=available,
        backend=cfg.backend,
        dtype_bytes=_dtype_bytes(cfg, device),
        quantization=quantization or cfg.base_quantization,
        lora_rank=cfg.lora_rank,
        lora_targets=tuple(cfg.lora_target_modules),
        checkpointing=cfg.gradient_checkpointing,
        cap=cfg.micro_batch_tokens or MAX_AUTO_TOKENS,
        span=cfg.max_seq_len,
    )


def cuda_available(device: str) -> int:
    """Bytes this process can still allocate on the device: free on the card and its own cached blocks,
    within the share of the card it is allowed (torch.cuda.set_per_process_memory_fraction)."""
    import torch

    device = _index(device)
    free, total = torch.cuda.mem_get_info(device)
    allocated = torch.cuda.memory_allocated(device)
    share = getattr(torch.cuda, "get_per_process_memory_fraction", lambda _device: 1.0)(device)
    return int(min(free + torch.cuda.memory_reserved(device), share * total) - allocated)


def _index(device: str) -> int:
    """The CUDA device's index ("cuda" is the current device): some of torch's memory calls need one."""
    import torch

    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def read_model_config(base_model_path: str) -> dict[str, Any]:
    """A model's config.json (a directory's, or a hub id's in the local Hugging Face cache), or {} when
    there is none that parses."""
    path = Path(base_model_path) / "config.json"
    if not path.is_file():
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(str(base_model_path), "config.json")
        except ValueError:  # not a repository id
            cached = None
        if not isinstance(cached, str):
            return {}
        path = Path(cached)
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def check_before_load(cfg: Any, base_model_path: str, device: str) -> MemoryPlan | None:
    """On a GPU: the plan of an update of the model in base_model_path, or TrainerDoesNotFit (before any
    weight is loaded). None on a CPU, and for a model whose shape the estimate cannot read."""
    if not str(device).startswith("cuda"):
        return None
    config = read_model_config(base_model_path)
    try:
        shape = ModelShape.from_config(config)
    except ValueError:
        return None  # an architecture of unknown shape: the out-of-memory retry is what guards it
    memory = plan_for(cfg, shape, cuda_available(device), device)
    if not memory.fits:
        four_bit = None if cfg.base_quantization == "4bit" else plan_for(cfg, shape, memory.available, device, "4bit")
        name = str(config.get("_name_or_path") or base_model_path).rstrip("/").rsplit("/", 1)[-1]
        raise TrainerDoesNotFit(refusal(name, device, memory, four_bit))
    return memory


def peak_start(device: str) -> int:
    """Start measuring an update's peak; returns the bytes allocated before it."""
    import torch

    torch.cuda.reset_peak_memory_stats(_index(device))
    return int(torch.cuda.memory_allocated(_index(device)))


def budget_after_update(device: str, *, before: int, largest: int, vocab: int, cap: int = MAX_AUTO_TOKENS) -> int:
    """The next updates' budget from this one's peak (peak_start's `before`; `largest`: the positions of its
    largest micro-batch), for what the device has free now."""
    import torch

    peak_over_base = int(torch.cuda.max_memory_allocated(_index(device))) - before - workspace_bytes(vocab, largest)
    room = cuda_available(device)
    room -= _margin(room)
    return measured_budget(peak_over_base=peak_over_base, tokens=largest, room=room, cap=cap, vocab=vocab)
