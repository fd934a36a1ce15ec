"""Where a GPU worker answers the OpenAI endpoint's requests (the playground, diffs, serve jobs, ART clients),
so that they never wait for a run step that holds the worker's inference server.

- BESIDE: the worker's inference server holds adapters side by side ("lora" mode: vLLM on a GPU, or
  ARTWEB_VLLM_ADAPTER_MODE=lora). Requests are answered on it at the same time as a step's rollouts, each
  side with adapters of its own names (adapter_cache.SERVING_PREFIX), so that neither retires the other's.
- OWN: it holds one policy at a time ("merged" mode: vLLM's CPU build, CTranslate2). A step's merges would
  swap the weights under a request, so requests go to a second server of the same engine, of their own
  (inference.serving_server): started on the first request, computing on ARTWEB_SERVE_THREADS cores, in
  merged mode too (vLLM's compiled path: a short answer on one core 0.4 s, where runtime adapters took 2.4 s
  on two). Requests for different policies take turns on it (training.serving.worker.Policies), and a
  checkpoint's merge is done before its turn.
- GATE: merged mode where that second server cannot be: ARTWEB_SERVE_THREADS=0, too little memory for it
  (ARTWEB_SERVE_SERVER_GB, or the estimate below), or its start failed. Requests are answered on the
  worker's own server between steps, holding the serving gate (training.services.serving_gate), as every
  request did before this module; a log line says why.

No Django models here: the serving thread (training.serving.worker) asks route() for each request.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from django.conf import settings

from rollouts.inference.inference_server import InferenceServerError
from rollouts.inference.vllm_server import resolved_adapter_mode
from training.services import inference

logger = logging.getLogger(__name__)

BESIDE, OWN, GATE = "beside", "own", "gate"
GiB = 2**30
# Resident memory of a serving server beyond its weights and KV cache, measured with the default model on
# two cores (bench/results/serve_during_step.md): vLLM's CPU build 3.1 GiB in all (its API server and engine
# processes), CTranslate2 1.6 GiB.
RUNTIME_GIB = {"vllm": 2.6, "ctranslate2": 1.1}
# What must stay available beside it, for the step's own peaks (the update's activations, a merge).
MEMORY_LEFT_GIB = 1.0
REFUSAL_RETRY_SECONDS = 300  # how long a refused second server is not tried again

_refused_until = 0.0  # time.monotonic() until which requests take the GATE route (a refusal's)
_refusal_lock = threading.Lock()


class ServingServerRefused(RuntimeError):
    """The second server could not start: this request, and those of the next minutes, go through the gate."""


def holds_one_policy() -> bool:
    """Whether this worker's inference server holds one policy at a time ("merged" mode). Settled before
    any server starts: CTranslate2 is merged only; vLLM's "auto" is merged on its CPU build."""
    server = inference._server
    if server is not None and server.adapter_mode != "auto":
        return server.merged
    if inference.inference_engine().engine == "ctranslate2":
        return True
    conf = settings.ARTWEB
    return resolved_adapter_mode(conf["VLLM_ADAPTER_MODE"], conf["VLLM_PYTHON"] or None) == "merged"


def threads() -> int:
    """ARTWEB_SERVE_THREADS: the cores the second server computes on; by default a quarter of this
    process's cores, at least one. 0: no second server."""
    value = settings.ARTWEB["SERVE_THREADS"]
    if value is None:
        return max(1, len(os.sched_getaffinity(0)) // 4)
    return max(0, int(value))


def cpus() -> list[int]:
    """The cores the second server computes on: the last threads() of those this process may use (a step's
    server and trainer use them all; its share is bounded, the step's is not)."""
    allowed = sorted(os.sched_getaffinity(0))
    return allowed[-min(threads(), len(allowed)) :]


def route(base_model) -> str:
    """BESIDE, OWN or GATE for a request to this base model (the module's docstring says which when)."""
    if not holds_one_policy():
        return BESIDE
    if threads() == 0:
        return GATE
    if inference._serving is not None and inference._serving_model == inference._served_as(base_model):
        return OWN
    with _refusal_lock:
        if time.monotonic() < _refused_until:
            return GATE
    need, available = memory_needed(base_model), memory_available()
    if inference._serving is not None:  # another model's, stopped first: what it holds comes back
        available += need
    if available - need < MEMORY_LEFT_GIB * GiB:
        refuse(
            f"it would take about {need / GiB:.1f} GiB and {available / GiB:.1f} GiB is available "
            f"(at least {MEMORY_LEFT_GIB:g} GiB must stay free beside it; ARTWEB_SERVE_SERVER_GB sets what it takes)"
        )
        return GATE
    return OWN


def server(base_model):
    """The second server of this base model, started if need be; ServingServerRefused when it cannot start."""
    try:
        # On a GPU (merged there only when asked for) it computes on the card: its processes keep every core.
        return inference.serving_server(base_model, cpus=cpus() if settings.ARTWEB["DEVICE"] == "cpu" else None)
    except InferenceServerError as exc:
        refuse(f"it did not start: {exc}")
        raise ServingServerRefused(str(exc)) from exc


def refuse(reason: str) -> None:
    """No second server for REFUSAL_RETRY_SECONDS: requests wait for the steps meanwhile, and the log says why."""
    global _refused_until
    with _refusal_lock:
        _refused_until = time.monotonic() + REFUSAL_RETRY_SECONDS
    logger.warning(
        "serving: no inference server of its own for the OpenAI endpoint: %s. Requests are answered between the "
        "run steps of this worker (they wait for a running step); tried again in %d s.",
        reason,
        REFUSAL_RETRY_SECONDS,
    )


def server_of(route: str) -> tuple:
    """(the server requests of this route are answered on, the model it serves): the endpoint's own for OWN,
    else the worker's; (None, None) while none runs."""
    if route == OWN:
        return inference._serving, inference._serving_model
    return inference._server, inference._server_model


def side_by_side(route: str, served: str) -> bool:
    """Whether the server requests of this route and model are answered on holds adapters side by side: its
    requests for different checkpoints and the base model are then answered at once."""
    server, model = server_of(route)
    return server is not None and model == served and not server.merged


def waits_for_steps() -> bool:
    """Whether this worker's requests go through the serving gate now (the serving thread takes none from the
    queue while a step holds it, leaving it for another worker)."""
    if not holds_one_policy():
        return False
    if threads() == 0:
        return True
    with _refusal_lock:
        return time.monotonic() < _refused_until


def model_held() -> str | None:
    """The model (inference._served_as) of the running server this worker's requests are answered on: a
    worker that holds a model's weights serves that model, and leaves the others to workers that hold theirs.
    None: any model (none runs; or the second server is to be, which starts for any, the step's left alone)."""
    server, model = server_of(OWN if holds_one_policy() and not waits_for_steps() else GATE)
    return model if server is not None and server.is_alive() else None


def memory_needed(base_model) -> int:
    """Bytes a second server of this model is expected to hold: ARTWEB_SERVE_SERVER_GB, or its weights as its
    engine holds them (vLLM in bf16, CTranslate2 in float32), its KV cache and RUNTIME_GIB."""
    conf = settings.ARTWEB
    if conf["SERVE_SERVER_GB"] is not None:
        return int(conf["SERVE_SERVER_GB"] * GiB)
    path = Path(inference.base_model_path(base_model))
    files = [*path.glob("*.safetensors"), *path.glob("*.bin")] if path.is_dir() else []
    weights = sum(f.stat().st_size for f in files)  # as stored: bf16 for most models
    engine = inference.inference_engine().engine
    if engine == "ctranslate2":
        return int(RUNTIME_GIB[engine] * GiB + 2 * weights)
    return int(RUNTIME_GIB["vllm"] * GiB + weights + inference.kv_cache_for(base_model) * GiB)


def memory_available() -> int:
    """Bytes this worker may still take: the system's MemAvailable, or less where its cgroup's memory limit
    (v2 or v1) is nearer. Where none can be read, no limit is known and none is set here."""
    known = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                known.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    if (left := _cgroup_memory_left()) is not None:
        known.append(left)
    return min(known) if known else 1 << 62


def _cgroup_memory_left() -> int | None:
    """Bytes left under this process's cgroup memory limit; None without one (or where it cannot be read). The
    group's directory, else its hierarchy's root (a container that sees its own group there)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, group = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy
            root, limit_file, usage_file = Path("/sys/fs/cgroup"), "memory.max", "memory.current"
        elif "memory" in controllers.split(","):  # v1: the memory controller's own
            root, limit_file, usage_file = (
                Path("/sys/fs/cgroup/memory"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        else:
            continue
        for directory in (root / group.lstrip("/"), root):
            try:
                limit = (directory / limit_file).read_text().strip()
                used = int((directory / usage_file).read_text())
            except (OSError, ValueError):
                continue
            if limit == "max" or int(limit) >= 1 << 60:  # v1 writes "no limit" as a number near 2**63
                return None
            return int(limit) - used
    return None
