"""Runs sharing one loaded trainer (training.services.trainer_pool): which runs can share its weights, and
where a parked run's state lives.

A parked state is a CheckpointState in memory (GRPOTrainer.snapshot): the LoRA's weights and the
optimizer's moments, a few MB for the default model and a few hundred at 7B, beside base weights of GBs.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import torch

from training.engine.checkpoint import CheckpointState

# The TrainConfig fields that decide the model a trainer loads: runs that differ in any of them cannot share
# its weights. Every other field (loss, learning rate and schedule, clipping, micro-batches) is the run's own
# and is swapped with its state.
STRUCTURE_FIELDS = (
    "backend",
    "dtype",
    "gradient_checkpointing",
    "base_quantization",
    "max_seq_len",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
)


def structure(trainer) -> tuple:
    """What a trainer loads: two runs whose trainers give the same tuple can train on one copy of it."""
    cfg = trainer.cfg.to_dict()
    fields = tuple((name, _hashable(cfg[name])) for name in STRUCTURE_FIELDS)
    return (trainer.base_model_path, trainer.device, trainer.chat_template or "", trainer.packed, fields)


def state_bytes(state: CheckpointState) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(state))


def to_device(state: CheckpointState, device: str) -> CheckpointState:
    """The state with its adapter and optimizer moments on `device` (a parked state that was moved to host
    memory goes back to the card before it is adopted)."""
    target = torch.device(device)
    state.adapter = {k: v.to(target) for k, v in state.adapter.items()}
    for moments in state.optimizer.get("state", {}).values():
        for name, value in moments.items():
            if torch.is_tensor(value) and value.dim() > 0:  # Adam's step count stays where torch keeps it
                moments[name] = value.to(target)
    return state


def fit_parked(parked: MutableMapping[int, Any], device: str, gpu_free_share: float, host_reserve: int) -> list[int]:
    """Keep the parked states within memory: on a GPU, move them to host memory (oldest first) while less than
    gpu_free_share of the card is free; then drop the oldest while the host has less than host_reserve
    bytes available. Returns the run ids dropped. `parked`: run id -> an object with `.state`, oldest first."""
    if device.startswith("cuda") and torch.cuda.is_available():
        for held in parked.values():
            free, total = torch.cuda.mem_get_info(torch.device(device))
            if free >= gpu_free_share * total:
                break
            held.state = to_device(held.state, "cpu")
    dropped = []
    while parked and _host_available() < host_reserve:
        run_id = next(iter(parked))
        del parked[run_id]
        dropped.append(run_id)
    return dropped


def _host_available() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def _tensors(state: CheckpointState):
    yield from state.adapter.values()
    for moments in state.optimizer.get("state", {}).values():
        yield from (v for v in moments.values() if torch.is_tensor(v))


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
