"""The worker's inference server and trainer: one of each per GPU worker process, reused across steps.

A GPU worker runs one run step at a time (concurrency 1), so plain module state is enough here. The
vLLM server is started for a base model on first use, restarted if it died, and stopped with the
worker. A second server, for RULER's judge, is started only when the first cannot serve the base model
while a step's policy is loaded (see judge_endpoint); another, for the OpenAI endpoint, only where the first
holds one policy at a time (serving_server; training.services.serving_server says when). The trainer stays
loaded between steps, and runs that load the same model share it, each run's own state swapped in for its
step (training.services.trainer_pool).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import hashlib
import logging
import math
import os
import threading
import time
from pathlib import Path

from django.conf import settings
from django.core.cache import cache

from artweb.cache import riding_out_outages
from rollouts.inference import cpu_probe
from rollouts.inference.adapter_cache import SERVING_PREFIX
from rollouts.inference.ct2_server import CT2Server
from rollouts.inference.inference_server import InferenceServerError
from rollouts.inference.vllm_server import TOOLS_TEMPLATE, VLLMServer, template_supports_tools
from rollouts.sandbox.jail import JailConfig
from rollouts.sandbox.proxy import Upstream
from rollouts.sandbox.uid_lease import uid_range
from training.services import trainer_pool
from training.services.model_files import model_files_check
from training.services.policy_push import trainer_weights

logger = logging.getLogger(__name__)

# The inference server's KV cache on a CPU, in GiB, unless ARTWEB_VLLM_KV_CACHE_GB says otherwise: the CPU
# build holds all of it resident from its start. A step of the shipped example (24 rollouts of the default
# model) uses about 60 MB; 0.25 GiB holds some 11k tokens of it (bench/results/kv_cache_cpu.md).
CPU_KV_CACHE_GB = 0.25
# What a rollout's sequence holds beside one completion (the prompt, earlier turns) when a GPU server's KV
# cache is sized for the run that starts it (kv_cache_for).
PROMPT_TOKENS = 512

_lock = threading.Lock()
_server = None  # an InferenceServer: rollouts.inference.vllm_server.VLLMServer or ct2_server.CT2Server
_engine: tuple[tuple[str, str], cpu_probe.Choice] | None = None  # (device, setting) -> the server it starts
_server_model: str | None = None  # _served_as() of the model it serves
_judge = None  # a VLLMServer of the base model alone, for RULER while _server holds merged policy weights
_judge_model: str | None = None
# The OpenAI endpoint's requests, beside the steps (training.services.serving_server): on _server where it
# holds adapters side by side (server_beside), else on a server of their own (serving_server).
_users = 0  # requests answered on _server beside the steps: it is not stopped under them
_replacing = False  # inference_server() waits for those, to stop _server for another model
_users_done = threading.Condition()  # not _lock: a request never waits for a start (a step's judge, ...)
_serving_lock = threading.Lock()  # not _lock: a step never waits for the serving server's start
_serving = None  # the endpoint's own server (merged mode), started on its first request
_serving_model: str | None = None
# Its processes before a step's on the cores it shares with them (where the worker may raise a priority): a
# request's first token does not wait behind the step's rollouts and update for its share of a core.
SERVING_NICE = -5
# Starts that failed: (the served identity and max length) -> (time.monotonic() of the failure, its message).
_start_failures: dict[str, tuple[float, str]] = {}
START_RETRY_SECONDS = 300  # how long a model whose start failed is refused at once, with that failure's reason
_resident_reference: int | None = None  # release_memory's: resident bytes after the first step since a trim
RSS_GROWTH = 1.5  # release_memory trims when a step leaves the worker this many times its reference


def base_model_path(base_model) -> str:
    return base_model.local_path or base_model.source


def jail_config():
    """The sandbox settings as the runtime takes them."""
    conf = settings.ARTWEB
    return JailConfig(
        mode=conf["SANDBOX"],
        uids=uid_range(conf["SANDBOX_UIDS"]),
        cgroup_parent=conf["SANDBOX_CGROUP"],
        uid_locks=conf["SANDBOX_UID_LOCKS"],
    )


def vocab_size(base_model) -> int | None:
    """Rows of the model's embedding: every token id a sandbox reports must be below it."""
    import json

    try:
        config = json.loads((Path(base_model_path(base_model)) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(size) if isinstance(size, int) else None


def chat_template_file(base_model) -> str | None:
    """The chat template the server renders this model's conversations with, and the trainer tokenizes
    them with, as a file (vLLM's --chat-template takes a path); None: the model's own.

    The base model's chat_template_override when it has one, written under the data directory with its
    content's hash for a name (each distinct template is written once; an edited one gets a new file).
    Otherwise artweb's ChatML-with-tools template when the model's own cannot render tools, as the
    server would pick by itself: named here, the trainer gets the same one. Both render templates in
    Jinja's sandbox (transformers' apply_chat_template), a template from a user included.
    """
    text = base_model.chat_template_override or ""
    if not text.strip():
        return None if template_supports_tools(base_model_path(base_model)) else str(TOOLS_TEMPLATE)
    path = Path(settings.DATA_DIR) / "chat-templates" / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.jinja"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_text(text)
        os.replace(partial, path)  # never a half-written template where a server may read it
    return str(path)


def _served_as(base_model) -> str:
    """What a running server must match to serve this model: its weights and its chat template."""
    return f"{base_model_path(base_model)}|{chat_template_file(base_model) or ''}"


def inference_server(base_model, *, run=None):
    """A healthy inference server for this base model (started or restarted as needed; a start for `run`
    sizes a GPU server's KV cache for that run's rollouts, kv_cache_for).

    Another model's server is stopped only once this model can be started: its files pass the check
    registration makes (ApplicationError, the running server untouched), and it did not fail to start in
    the last START_RETRY_SECONDS (InferenceServerError, at once, with that start's reason). A server that
    fails to start is stopped and not kept: the worker then holds none, and the next request for any model
    starts its own."""
    global _server, _server_model

    served = _served_as(base_model)
    with _lock:
        if _server is not None and _server_model == served:
            _server.ensure_running()
            return _server
        failure_key = f"{served}|{base_model.max_length}"  # a max length changed since is another start
        _start_failure_check(failure_key)
        model_files_check(base_model_path(base_model))
        if _server is not None:
            _server_take().stop()
        if _judge is not None and _judge_model != served:
            _judge_stop()  # another base model's judge only holds memory
        server = _new_server(
            base_model,
            port=settings.ARTWEB["VLLM_PORT"],
            adapter_mode=settings.ARTWEB["VLLM_ADAPTER_MODE"],
            kv_cache_gb=kv_cache_for(base_model, run),
        )
        try:
            server.start()
        except BaseException as exc:
            server.stop()  # what the start left: its processes, its work directory
            if isinstance(exc, InferenceServerError):  # the server's own failure, not an interruption
                _start_failures[failure_key] = (time.monotonic(), str(exc))
            raise
        _start_failures.pop(failure_key, None)
        _server, _server_model = server, served
        return server


def _server_take():
    """Under _lock: _server, no longer the worker's, once no request is answered on it beside the steps (new
    ones are held back meanwhile, server_beside)."""
    global _server, _server_model, _replacing
    with _users_done:
        _replacing = True
        _users_done.wait_for(lambda: not _users)
        server, _server, _server_model, _replacing = _server, None, None, False
    return server


@contextlib.contextmanager
def server_beside(base_model):
    """The server of this base model, held for one request to the OpenAI endpoint answered beside what a step
    does on it, where it holds adapters side by side ("lora" mode; the two load adapters under names of their
    own, adapter_cache.SERVING_PREFIX); inference_server() stops no server a request holds. None: no such
    server runs (none, another model's, one being replaced, or one holding one policy at a time)."""
    global _users
    served = _served_as(base_model)
    with _users_done:
        server = _server
        if server is None or _replacing or _server_model != served or server.merged or not server.is_alive():
            server = None
        else:
            _users += 1
    try:
        yield server
    finally:
        if server is not None:
            with _users_done:
                _users -= 1
                _users_done.notify_all()


def serving_server(base_model, *, cpus: list[int] | None):
    """A healthy server of this base model for the OpenAI endpoint alone, where _server holds one policy at a
    time (training.services.serving_server): a step's merges never touch it. cpus: the cores its engine
    computes on (None: all). InferenceServerError when it cannot start (nothing of it kept)."""
    global _serving, _serving_model
    served = _served_as(base_model)
    with _serving_lock:
        if _serving is not None and _serving_model == served:
            _serving.ensure_running()
            return _serving
        _serving_stop()
        # Merged, as the worker's own: runtime adapters on a CPU cost vLLM its compiled path (a short answer
        # took 2.4 s where merged weights took 0.4; swapping the weights between turns costs far less).
        server = _new_server(base_model, port=None, adapter_mode="merged", cpus=cpus)
        server.nice = SERVING_NICE
        try:
            server.start()
        except BaseException:
            server.stop()
            raise
        _serving, _serving_model = server, served
        return server


def _serving_stop() -> None:
    global _serving, _serving_model
    if _serving is not None:
        _serving.stop()
    _serving, _serving_model = None, None


def _start_failure_check(key: str) -> None:
    """InferenceServerError with the reason the start of `key` failed, when that was less than
    START_RETRY_SECONDS ago: each start of a model that cannot start takes as long as a good one."""
    failed = _start_failures.get(key)
    if failed is None:
        return
    failed_at, message = failed
    left = START_RETRY_SECONDS - (time.monotonic() - failed_at)
    if left <= 0:
        del _start_failures[key]
        return
    when = f"{math.ceil(left / 60)} min" if left > 60 else f"{math.ceil(left)} s"
    raise InferenceServerError(f"{message} (This start failed on this worker; it is tried again in about {when}.)")


def release_memory() -> None:
    """Hand memory back to the system when the worker's resident set keeps growing over a run.

    Each step frees what it allocated, and glibc keeps the freed blocks in its arenas for the next step.
    When steps load and drop whole copies of the weights (the merge of a merged-mode adapter, a trainer
    reloaded for another run), blocks of those can stay unused and the resident memory ratchet up;
    malloc_trim hands them back. It hands back the update's working set too, which the next update then
    faults in page by page, at about half speed on 2 cores: trimmed after every step, an update took
    10-40 % longer (an 835-token batch 4.8 s untrimmed, 7.1 s trimmed). So the trim runs only when a step
    leaves the worker RSS_GROWTH times larger than it was after the first step since its start or the
    last trim: a run's batches vary in size well within that, a ratchet does not stay within it.

    The trim (0.1-0.2 s on 2 cores) runs on a thread of its own: ctypes lets go of the GIL, so the next
    step starts meanwhile instead of waiting on it."""
    import ctypes

    gc.collect()
    if not _trim_due(_resident_bytes()):
        return
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: its allocator returns memory its own way
        return
    threading.Thread(target=trim, args=(0,), name="malloc-trim", daemon=True).start()


def _trim_due(resident: int) -> bool:
    """release_memory's rule, given the worker's resident bytes after a step (see there)."""
    global _resident_reference
    if _resident_reference is None:
        _resident_reference = resident
        return False
    if resident <= _resident_reference * RSS_GROWTH:
        return False
    _resident_reference = None  # the step after the trim sets it again, from what that step keeps
    return True


def _resident_bytes() -> int:
    """This process's resident memory (its inference server runs in a process of its own)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def server_died() -> bool:
    """The inference server (or the judge's) was started and its process has exited since."""
    return any(s is not None and s._proc is not None and not s.is_alive() for s in (_server, _judge))


def inference_engine() -> cpu_probe.Choice:
    """The inference server this worker runs: vLLM on a GPU; on a CPU, the one ARTWEB_INFERENCE_ENGINE
    names, or with "auto" the one rollouts.inference.cpu_probe measured faster on this processor."""
    global _engine
    conf = settings.ARTWEB
    asked = (conf["DEVICE"], conf["INFERENCE_ENGINE"])
    if _engine is None or _engine[0] != asked:
        if conf["DEVICE"] != "cpu" and conf["INFERENCE_ENGINE"] == "auto":
            choice = cpu_probe.Choice(engine="vllm", reason=f"ARTWEB_DEVICE={conf['DEVICE']}: vLLM on the GPU")
        else:
            choice = cpu_probe.choose(conf["INFERENCE_ENGINE"], cache_file=Path(settings.DATA_DIR) / "cpu-probe.json")
        logger.info("inference server: %s (%s)", choice.engine, choice.reason)
        _engine = (asked, choice)
    return _engine[1]


def kv_cache_for(base_model, run=None) -> float:
    """The KV cache (GiB) of a new inference server: ARTWEB_VLLM_KV_CACHE_GB when set; CPU_KV_CACHE_GB on a
    CPU; on a GPU, sized from the model's shape for the run that starts it (its rollouts in flight, each up
    to max_tokens + PROMPT_TOKENS, at most the model's length) in the card's free memory, leaving the
    trainer its weights and a 4,096-token update when it shares the card (training.engine.fit.kv_cache_gib).
    Without a run, or where the shape or the card cannot be read: fit.KV_CACHE_MIN_GIB. The server is shared,
    so the run that starts it sizes it; later runs use it as it is."""
    conf = settings.ARTWEB
    if conf["VLLM_KV_CACHE_GB"]:
        return conf["VLLM_KV_CACHE_GB"]
    if conf["DEVICE"] == "cpu":
        return CPU_KV_CACHE_GB
    from training.config import RunConfig
    from training.engine import fit

    try:
        shape = fit.ModelShape.from_config(fit.read_model_config(base_model_path(base_model)))
    except ValueError:
        return fit.KV_CACHE_MIN_GIB
    if run is None:
        return fit.KV_CACHE_MIN_GIB
    cfg = RunConfig.model_validate(run.config)
    sequences = min(cfg.concurrency, cfg.group_size * cfg.scenarios_per_step)
    tokens = min(base_model.max_length or cfg.max_tokens + PROMPT_TOKENS, cfg.max_tokens + PROMPT_TOKENS)
    own_card = bool(conf["VLLM_CUDA_DEVICES"])
    try:
        import torch

        index = int(conf["VLLM_CUDA_DEVICES"].split(",")[0]) if own_card else fit._index(conf["DEVICE"])
        free, _total = torch.cuda.mem_get_info(index)
    except (ImportError, RuntimeError, ValueError, AssertionError):
        return fit.KV_CACHE_MIN_GIB
    trainer = (
        0
        if own_card
        else fit.plan_for(_train_config(run), shape, free, conf["DEVICE"]).need(fit.TRAINER_RESERVE_TOKENS)
    )
    size = fit.kv_cache_gib(shape, sequences=sequences, tokens=tokens, free=free, trainer=trainer)
    logger.info(
        "run %s: inference server KV cache %.1f GiB for %d rollouts in flight of up to %d tokens (%.1f GiB free)",
        run.id,
        size,
        sequences,
        tokens,
        free / fit.GiB,
    )
    return size


def _new_server(
    base_model, *, port: int | None, adapter_mode: str, kv_cache_gb: float | None = None, cpus: list[int] | None = None
):
    """cpus: the only cores the server runs on, its engine computing with one thread on each; None: all."""
    conf = settings.ARTWEB
    if inference_engine().engine == "ctranslate2":
        return CT2Server(
            model_path=base_model_path(base_model),
            chat_template=chat_template_file(base_model),
            port=port,
            max_model_len=base_model.max_length,
            log_dir=str(Path(settings.DATA_DIR) / "logs"),
            cpus=cpus,
        )
    return VLLMServer(
        model_path=base_model_path(base_model),
        chat_template=chat_template_file(base_model),
        python=conf["VLLM_PYTHON"] or None,
        port=port,
        max_model_len=base_model.max_length,
        extra_args=conf["VLLM_EXTRA_ARGS"].split() if conf["VLLM_EXTRA_ARGS"] else [],
        enforce_eager=conf["VLLM_ENFORCE_EAGER"],
        kv_cache_gb=kv_cache_gb or kv_cache_for(base_model),
        adapter_mode=adapter_mode,
        log_dir=str(Path(settings.DATA_DIR) / "logs"),
        extra_env={"CUDA_VISIBLE_DEVICES": conf["VLLM_CUDA_DEVICES"]} if conf["VLLM_CUDA_DEVICES"] else None,
        cpus=cpus,
        weights_source=trainer_weights,
    )


def judge_endpoint(base_model, *, server, policy_name: str):
    """(name, Upstream) of a RULER judge for a batch whose policy `policy_name` runs on `server`.

    The judge is the run's base model. In "lora" mode `server` answers to the base model's name beside
    every adapter, and in "merged" mode it does while the policy is the base model itself (step 0). In
    merged mode with a step's weights loaded it answers to that step's name only, so the judge is a
    second server of the base model, started on first need (minutes on CPU) and kept for later steps.
    (Merged mode on a GPU puts both servers on one card, beside the trainer: each takes its weights and a
    KV cache of ARTWEB_VLLM_KV_CACHE_GB, see VLLMServer.command.)
    """
    name = server.base_model_name
    if not server.merged or policy_name == name:
        return name, Upstream(server.base_url, server.api_key)
    judge = judge_server(base_model)
    return judge.base_model_name, Upstream(judge.base_url, judge.api_key)


def judge_server(base_model):
    """A healthy inference server of the base model alone (no adapter is ever loaded into it)."""
    global _judge, _judge_model
    served = _served_as(base_model)
    with _lock:
        if _judge is not None and _judge_model != served:
            _judge_stop()
        if _judge is None:
            # "merged" with nothing ever merged serves the base weights on the compiled CPU path;
            # "lora" would turn graph compilation off for adapters it never loads.
            _judge = _new_server(base_model, port=None, adapter_mode="merged")
            _judge_model = served
            _judge.start()
        _judge.ensure_running()
        return _judge


def _judge_stop() -> None:
    global _judge, _judge_model
    if _judge is not None:
        _judge.stop()
    _judge, _judge_model = None, None


def adapters_loaded_publish() -> None:
    """Tell the web side which adapters a run step's server has loaded (checkpoint deletion refuses those). The
    endpoint's copies (SERVING_PREFIX names, or on its second server) hold no checkpoint: ART deletes the one
    its client's rollouts were answered with after a step, and the web refuses requests for a deleted one."""
    adapters = dict(server.adapters) if (server := _server) is not None else {}  # read once: it may be replaced
    paths = [path for name, path in adapters.items() if not name.startswith(SERVING_PREFIX)]
    riding_out_outages(lambda: cache.set("artweb:loaded_adapters", paths, timeout=None), what="the loaded adapters")


def trainer_for(run, *, checkpoint_dir: str | None):
    """The trainer holding this run at run.steps_done (checkpoint_dir: that step's checkpoint, None at step 0),
    loaded, or swapped in beside other runs' states (training.services.trainer_pool)."""

    def make():
        from training.engine.trainer import make_trainer  # here: only a process that trains needs torch

        # Seeded by the run's seed, as its scenario sampling is; the server's chat template tokenizes.
        template = chat_template_file(run.base_model)
        return make_trainer(
            _train_config(run),
            base_model_path=base_model_path(run.base_model),
            device=settings.ARTWEB["DEVICE"],
            seed=int(run.config.get("seed", 0)),
            chat_template=Path(template).read_text() if template else None,
        )

    return trainer_pool.trainer_for(run, checkpoint_dir=checkpoint_dir, make=make)


def _train_config(run):
    from training.engine.config import TrainConfig

    # The backend belongs to the worker's hardware (unsloth on GPU hosts, peft on CPU), not to the run.
    return TrainConfig.from_dict({**run.config.get("train", {}), "backend": settings.ARTWEB["TRAINER_BACKEND"]})


def trainer_fit_check(run) -> None:
    """Before a run's rollouts on a GPU where no trainer is loaded: fit.TrainerDoesNotFit, saying what would
    fit, when the run's model cannot be trained in the memory left beside the inference server. (With another
    run's trainer loaded, the check waits for trainer_for, which frees it first; and with one being loaded by
    the warm-up, which checked it, a card part-filled by that load would say too little is free.)"""
    if trainer_pool.trainer_loaded() is not None or trainer_pool.trainer_preloading():
        return
    from training.engine import fit

    fit.check_before_load(_train_config(run), base_model_path(run.base_model), settings.ARTWEB["DEVICE"])


trainer_advanced = trainer_pool.trainer_advanced
trainer_close = trainer_pool.trainer_close
trainer_run_finished = trainer_pool.trainer_run_finished


def shutdown() -> None:
    global _server
    trainer_close()
    if _server is not None:
        _server.stop()
        _server = None
    _judge_stop()
    with _serving_lock:
        _serving_stop()


atexit.register(shutdown)
