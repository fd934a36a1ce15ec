"""Checkpoint directory I/O.

A checkpoint is one directory:
  adapter_config.json, adapter_model.safetensors   the LoRA adapter in PEFT format (vLLM loads it as is)
  trainer_state.pt    optimizer and scheduler state, RNG states (python, numpy, torch, cuda), step, the micro-batch budget
  train_config.json   the TrainConfig it was trained with
  checkpoint.json     {"format": 1, "step": n}, written last: a directory without it is incomplete
It is written to a sibling staging directory and renamed into place, so a crash never leaves a
half-written checkpoint under the final name.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = 1
ADAPTER_WEIGHTS = "adapter_model.safetensors"
STATE_FILE = "trainer_state.pt"
CONFIG_FILE = "train_config.json"
META_FILE = "checkpoint.json"


class CheckpointError(RuntimeError):
    pass


@dataclass
class CheckpointState:
    adapter: dict[str, torch.Tensor]  # PEFT-format adapter weights, as saved
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    rng: dict[str, Any]
    param_names: list[str]  # order of the optimizer's parameters
    config: dict[str, Any]
    step: int
    micro_batch_tokens: int | None = None  # the update's micro-batch budget the run had reached (None: not saved)


def capture_rng() -> dict[str, Any]:
    """Every RNG a training step may draw from, in types torch.load(weights_only=True) accepts."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(_as_tuple(state["python"]))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(value: Any) -> Any:
    """random.setstate wants nested tuples; serialisation may hand back lists."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def write_checkpoint(
    directory: str | os.PathLike,
    *,
    peft_model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    param_names: list[str],
    config: dict[str, Any],
    step: int,
    micro_batch_tokens: int | None = None,
) -> dict:
    """Write a new checkpoint directory; return {"size_bytes", "step"}.

    The files are written aside, flushed to disk, and the directory renamed into place, so `directory`
    either does not exist or holds a whole checkpoint, whenever the process is killed. An existing
    `directory` is never replaced (CheckpointError): a checkpoint, once written, is immutable, and each
    attempt at a step writes a directory of its own (see training.services.steps)."""
    final = Path(directory)
    if final.exists():
        raise CheckpointError(f"{final} exists already; a checkpoint directory is written once")
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        peft_model.save_pretrained(str(staging), safe_serialization=True)
        torch.save(
            {
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": capture_rng(),
                "param_names": param_names,
                "step": step,
                "micro_batch_tokens": micro_batch_tokens,
            },
            staging / STATE_FILE,
        )
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
        (staging / META_FILE).write_text(json.dumps({"format": FORMAT, "step": step}))
        _fsync_tree(staging)
        os.rename(staging, final)  # fails rather than merge if another writer got there first
        _fsync_dir(final.parent)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    size = sum(p.stat().st_size for p in final.rglob("*") if p.is_file())
    return {"size_bytes": size, "step": step}


def _fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    for path in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_checkpoint(directory: str | os.PathLike) -> CheckpointState:
    from safetensors.torch import load_file

    path = Path(directory)
    if not (path / META_FILE).exists():
        raise CheckpointError(f"{path} is not a complete checkpoint ({META_FILE} is missing)")
    meta = json.loads((path / META_FILE).read_text())
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {meta.get('format')}, this code reads {FORMAT}")
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    return CheckpointState(
        adapter=load_file(str(path / ADAPTER_WEIGHTS)),
        optimizer=state["optimizer"],
        scheduler=state["scheduler"],
        rng=state["rng"],
        param_names=list(state["param_names"]),
        config=json.loads((path / CONFIG_FILE).read_text()),
        step=int(state["step"]),
        micro_batch_tokens=state.get("micro_batch_tokens"),
    )
