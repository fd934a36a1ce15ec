"""artweb's vLLM plugin: vLLM loads it (entry point "vllm.general_plugins") in each of its processes.

ARTWEB_VLLM_BUSY_LOOP_S, when set (VLLMServer sets it for vLLM's CPU build), is how long the readers of
vLLM's shared-memory queues, the engine core and its worker, keep spinning after a message before they
sleep until the next one. vLLM's own figure is a fixed second at a full core, after every burst of
requests; on a machine of a few cores that second is taken from whatever runs next, and a step's update
starts right after its rollouts. Measured on 2 cores: the worker process used 0.97 CPU-seconds in the
1.5 s after a batch of 24 rollouts. Between two decoding steps the readers wait milliseconds, so they
still spin there. Unset, nothing changes.
"""

from __future__ import annotations

import os

BUSY_LOOP_ENV = "ARTWEB_VLLM_BUSY_LOOP_S"


def register() -> None:
    value = os.environ.get(BUSY_LOOP_ENV, "").strip()
    if value:
        shorten_busy_loop(busy_loop_seconds(value))


def busy_loop_seconds(value: str) -> float:
    """ARTWEB_VLLM_BUSY_LOOP_S's value as seconds; a clear error when it is not a number of seconds."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"{BUSY_LOOP_ENV} must be a number of seconds, 0 or more (e.g. 0.05); it is {value!r}")
    return seconds


def shorten_busy_loop(seconds: float) -> None:
    """Cap every queue reader's busy loop at `seconds`, readers made before this call included."""
    try:
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    except ImportError:  # another vLLM layout: it keeps its own timing
        return
    original = SpinCondition.wait
    if getattr(original, "artweb_busy_loop_s", None) == seconds:
        return

    def wait(self, *args, **kwargs):
        self.busy_loop_s = min(self.busy_loop_s, seconds)
        return original(self, *args, **kwargs)

    wait.artweb_busy_loop_s = seconds
    SpinCondition.wait = wait
