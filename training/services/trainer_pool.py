"""The GPU worker's trainer, shared by the runs it steps: one copy of the base weights, each run's own LoRA,
optimizer, schedule and RNG swapped in for its step.

A worker steps whichever run the queue gives it (training.services.steps.fair), so consecutive steps are
often of different runs. Reloading the base model for each (and reading the run's checkpoint back) cost
a switch seconds on a CPU and tens of seconds at 7B; instead, when the next step is another run's:

- the run trained last is parked: its state as save_checkpoint writes it, kept in memory (snapshot());
- the next run's parked state, or else its latest checkpoint read from disk, is adopted by the trainer
  already loaded, when both runs load the same model (parking.structure: base model, backend, precision,
  LoRA shape); otherwise the base model is loaded anew (and a run starting from step 0 always loads it:
  its fresh LoRA is initialised from its own seed exactly as when it trained alone).

A state is used only for the step and the checkpoint it was taken at (the run's latest committed
checkpoint's directory): an attempt whose step another worker committed, or that failed, never leaks into
the run. Adopting a state restores exactly what reading the checkpoint would (tests/training/test_trainer_pool.py).

ARTWEB_RUNS_PER_WORKER bounds the runs whose state a worker keeps (the one loaded included); the least
recently used is dropped beyond it, or when memory runs short: parked states move off the GPU to host
memory when the card's free memory falls under PARK_ON_GPU_FREE_SHARE of it, and are dropped when the
host's available memory falls under HOST_RESERVE_BYTES. A dropped state costs only a checkpoint read.

Two threads use the pool: the step's, and at the process's start the warm-up's (training.services.warmup),
which loads the trainer for the run a step will most likely take next. One lock keeps trainer_for,
trainer_advanced and trainer_close from running at once: a step that asks for the trainer while the warm-up
loads it waits for that load (its phase trainer_load counts the wait), then takes it as any step takes the
trainer loaded before it. The lock covers the pool's own state and a load, never the step's use of the
trainer (its update and checkpoint): the warm-up loads only where no trainer is loaded (trainer_preload), so
it never swaps a run out from under a step that holds it.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

logger = logging.getLogger(__name__)

HELD_KEY = "artweb:worker_runs"  # worker name -> {"runs": [run ids whose state it holds], "at": unix time}
HELD_TTL_S = 3600  # a worker that published nothing for this long is left out
PARK_ON_GPU_FREE_SHARE = 0.25  # parked states stay on the card while a quarter of it is free
HOST_RESERVE_BYTES = 2 << 30  # parked states are dropped before the host's available memory falls under this


@dataclass
class _Held:
    """A run's state at a step: `key` (run id, step, checkpoint directory or "" at step 0)."""

    key: tuple[int, int, str]
    structure: tuple
    updates: int = 0  # the loaded trainer's update count at `key`: an update since, never committed, spoils it
    state: Any = None  # a CheckpointState while parked; None for the loaded trainer's own run


_trainer = None  # the GRPOTrainer loaded
_current: _Held | None = None  # the run the loaded trainer holds now
_parked: collections.OrderedDict[int, _Held] = collections.OrderedDict()  # run id -> its state, oldest first
# Held by trainer_for, trainer_advanced, trainer_close, held_runs and a warm-up's trainer_preload block;
# reentrant, as the warm-up's block calls trainer_for.
_lock = threading.RLock()
_preloading = False  # inside trainer_preload's block: the warm-up is loading a trainer


def trainer_for(run, *, checkpoint_dir: str | None, make) -> Any:
    """The trainer, holding `run` at its latest committed step (checkpoint_dir: that step's checkpoint, None at
    step 0). `make()`: a new, unloaded trainer for the run (its config, seed, base model and device). Waits
    for a load the warm-up is doing, and then takes its trainer as the one loaded."""
    with _lock:
        return _trainer_for(run, checkpoint_dir, make)


def _trainer_for(run, checkpoint_dir: str | None, make) -> Any:
    global _trainer, _current
    from training.engine import parking

    key = (run.id, run.steps_done, checkpoint_dir or "")
    if _trainer is not None and _current is not None and _current.key == key and _trainer.step == _current.updates:
        return _trainer
    candidate = make()
    structure = parking.structure(candidate)
    _park_current(loading=run.id)
    held = _parked.pop(run.id, None)
    state = held.state if held is not None and held.key == key and held.structure == structure else None
    if state is not None:
        state = parking.to_device(state, settings.ARTWEB["DEVICE"])
    if _trainer is not None and _loaded_structure == structure and (state is not None or checkpoint_dir):
        _trainer.adopt(candidate.cfg, candidate.seed, state if state is not None else _read(checkpoint_dir))
        how = "kept in memory" if state is not None else "read from its checkpoint"
        logger.info("trainer: run %s at step %s adopted on the loaded weights (state %s)", *key[:2], how)
    else:
        _close_loaded()
        candidate.load(checkpoint_dir, state=state)
        _loaded(candidate, structure)
    _current = _Held(key=key, structure=structure, updates=_trainer.step)
    return _trainer


def trainer_advanced(run_id: int, step: int, checkpoint_dir: str) -> None:
    """The loaded trainer's run trained `step` and saved it to checkpoint_dir."""
    global _current
    with _lock:
        if _current is not None and _current.key[0] == run_id and _trainer is not None:
            _current = _Held(key=(run_id, step, checkpoint_dir), structure=_current.structure, updates=_trainer.step)
    held_publish()


def trainer_close() -> None:
    """Drop the trainer and every state kept: a step failed, or the worker stops. The runs resume from
    their checkpoints."""
    global _current
    with _lock:
        _parked.clear()
        _current = None
        _close_loaded()
    held_publish()


def trainer_run_finished(run_id: int) -> None:
    """A run ended: its state is dropped. The loaded weights stay for the runs whose states are kept (closing
    them made every other run's next step load the model and read its checkpoint again); where none is kept,
    the trainer is closed too, so that an idle worker holds no model."""
    global _current
    with _lock:
        _parked.pop(run_id, None)
        if _current is not None and _current.key[0] == run_id:
            _current = None
        if not _parked:
            _current = None
            _close_loaded()
    held_publish()


def trainer_loaded() -> Any:
    """The trainer loaded, or None; at once, even while a load is under way (see trainer_preloading)."""
    return _trainer


@contextlib.contextmanager
def trainer_preload() -> Iterator[bool]:
    """The warm-up's hold on the pool while it loads a trainer no step asked for yet: the block's trainer_for
    is its load, and every other thread's trainer_for, trainer_advanced and trainer_close waits for the
    block's end. Yields False, and the block should load nothing, where a trainer is loaded already: a
    step may be using it, and a load would swap its run out from under it."""
    global _preloading
    with _lock:
        if _trainer is not None:
            yield False
            return
        _preloading = True
        try:
            yield True
        finally:
            _preloading = False


def trainer_preloading() -> bool:
    """The warm-up is loading a trainer (inside trainer_preload's block): a step that finds no trainer
    loaded will find this one in trainer_for."""
    return _preloading


def held_runs() -> dict[int, int]:
    """Run id -> the step whose state this worker holds (loaded or parked)."""
    with _lock:
        runs = {held.key[0]: held.key[1] for held in _parked.values()}
        if _current is not None:
            runs[_current.key[0]] = _current.key[1]
    return runs


def held_publish() -> None:
    """Tell the operators' pages which runs' states this worker holds (training.selectors_ops reads it). Best
    effort: the figure is informational, and a step never waits on it."""
    from django.core.cache import cache

    from training.jobs.leases import worker_name

    try:
        workers = cache.get(HELD_KEY) or {}
        now = time.time()
        workers = {name: seen for name, seen in workers.items() if now - seen.get("at", 0) < HELD_TTL_S}
        workers[worker_name()] = {"runs": sorted(held_runs()), "at": now}
        cache.set(HELD_KEY, workers, timeout=HELD_TTL_S)
    except Exception:  # Redis away: the page shows the last figures it had
        logger.warning("could not publish the runs this worker holds", exc_info=True)


_loaded_structure: tuple | None = None


def _loaded(trainer, structure: tuple) -> None:
    global _trainer, _loaded_structure
    # The model, its tokenizer and the libraries they pulled in are a large graph that lives as long as the
    # trainer; freezing it takes it out of every later collection (release_memory's took ~0.35 s a step).
    # Collected first, so that no garbage of the step so far is frozen with it.
    gc.collect()
    gc.freeze()
    _trainer, _loaded_structure = trainer, structure


def _close_loaded() -> None:
    global _trainer, _loaded_structure
    if _trainer is not None:
        try:
            _trainer.close()
        except Exception:
            logger.warning("trainer close failed", exc_info=True)
        gc.unfreeze()  # what the old trainer held in cycles can be collected again
    _trainer, _loaded_structure = None, None


def _park_current(loading: int) -> None:
    """Keep the loaded run's state before run `loading`'s is swapped in, within the worker's limits: the
    states kept besides `loading`'s (which it takes out next) are at most ARTWEB_RUNS_PER_WORKER - 1."""
    global _current
    from training.engine import parking

    if _trainer is None or _current is None:
        return
    held, _current = _current, None
    if _trainer.step != held.updates:  # trained an update that no checkpoint holds: nothing to keep
        return
    held.state = _trainer.snapshot()
    _parked[held.key[0]] = held
    _parked.move_to_end(held.key[0])
    keep = max(0, int(settings.ARTWEB["RUNS_PER_WORKER"]) - 1)  # the run about to be loaded takes a place
    while len(others := [r for r in _parked if r != loading]) > keep:
        run_id = others[0]  # the least recently trained; never the run about to be loaded, whose state is wanted
        del _parked[run_id]
        logger.info("trainer: run %s's state dropped (ARTWEB_RUNS_PER_WORKER); it resumes from its checkpoint", run_id)
    for run_id in parking.fit_parked(_parked, settings.ARTWEB["DEVICE"], PARK_ON_GPU_FREE_SHARE, HOST_RESERVE_BYTES):
        logger.info("trainer: run %s's state dropped (memory); it resumes from its checkpoint", run_id)


def _read(checkpoint_dir: str):
    from training.engine.checkpoint import read_checkpoint

    return read_checkpoint(Path(checkpoint_dir))
