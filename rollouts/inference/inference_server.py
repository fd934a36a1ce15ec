"""What every inference server of a worker shares: its process, its key, and the policy it serves.

Two servers implement it: rollouts.inference.vllm_server.VLLMServer (vLLM, on GPUs and on processors
with bf16 units) and rollouts.inference.ct2_server.CT2Server (CTranslate2, on processors without them;
rollouts.inference.cpu_probe picks). Both are OpenAI-compatible servers in a process of their own, started
with a random API key that only the worker holds (rollouts reach them through rollouts.sandbox.proxy),
and both serve a step's policy in one of two ways (`adapter_mode`):

- "lora": runtime LoRA loading, several adapters side by side (vLLM only);
- "merged": the adapter is folded into the base weights (rollouts.inference.merge) and the server loads
  them in place; one policy at a time, at base-model speed.

Every name a server answers to — the base model or `<run>@<step>` — is served only while its weights
are the ones loaded, so a request never silently gets another policy.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx

from rollouts.inference.adapter_cache import SERVING_PREFIX
from rollouts.inference.merge import merge_adapter, rewrite_merged
from rollouts.inference.work_dirs import work_dir_create

logger = logging.getLogger(__name__)


class InferenceServerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class InferenceServer:
    """A server process for one base model. Subclasses give its command, environment and how it swaps
    merged weights (`command`, `environment`, `_swap_weights`), and may add the "lora" mode."""

    engine = "server"  # what people read in logs and errors: "vLLM", "CTranslate2"
    cpu_build = True
    cwd: str | None = None  # the directory the process starts in (None: the worker's)
    nice = 0  # its processes' niceness, where this process may set it (below 0: before others on its cores)

    def __init__(
        self,
        model_path: str,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        served_model_name: str | None = None,
        adapter_mode: str = "merged",
        log_dir: str | None = None,
        work_dir: str | None = None,
        api_key: str | None = None,
        cpus: list[int] | None = None,
    ) -> None:
        self.model_path = str(model_path)
        self.cpus = tuple(cpus) if cpus else None  # the only cores its processes run on (None: the worker's)
        self.host = host
        self.port = port or free_port()
        self.base_model_name = served_model_name or Path(self.model_path).name
        self.adapter_mode = adapter_mode
        self.log_dir = Path(log_dir) if log_dir else None
        self.api_key = api_key or secrets.token_urlsafe(32)
        self._work_dir = Path(work_dir) if work_dir else None
        self._own_work_dir = work_dir is None
        self.adapters: dict[str, str] = {}  # name -> adapter directory, as served now
        self._loaded: tuple[str, str] | None = None  # merged mode: (name, adapter path) in the weights
        self._merged_dir: Path | None = None  # merged mode: the last merged copy this server wrote
        self._proc: subprocess.Popen | None = None
        self._log_file = None
        self._log_path: Path | None = None  # the process's output (the log dir's, else the work dir's)
        self._log_start = 0  # where this start's output begins in it
        self._lock = threading.RLock()
        # No kept-alive connections: admin calls come seconds or minutes apart, and a pooled connection the
        # server has just closed fails the call ("Server disconnected without sending a response").
        self._http = httpx.Client(
            timeout=httpx.Timeout(600.0, connect=5.0), limits=httpx.Limits(max_keepalive_connections=0)
        )

    # --- what a subclass provides -------------------------------------------------------------------

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        raise NotImplementedError

    def _swap_weights(self, name: str, weights_dir: str | None) -> None:
        """Merged mode: load the weights in weights_dir (None: the base model's) and answer to `name` alone."""
        raise NotImplementedError

    def _resolve_mode(self) -> None:
        """Settle adapter_mode before the first start ("auto" becomes what this server does best)."""

    def _before_start(self) -> None:
        """Anything the process needs on disk before it starts."""

    # --- properties ---------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        """What a direct caller of the server sends (the proxy sends it for rollouts)."""
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def merged(self) -> bool:
        return self.adapter_mode == "merged"

    @property
    def work_dir(self) -> Path:
        """Where merged copies of the weights go (hundreds of MB each): a directory of this server's own
        unless the caller named one, removed by stop(), and by work_dirs_remove_orphaned() once the process
        that made it is gone (a worker killed before it could stop its server)."""
        if self._work_dir is None:
            self._work_dir = work_dir_create()
        self._work_dir.mkdir(parents=True, exist_ok=True)
        return self._work_dir

    def loaded_adapter_paths(self) -> set[str]:
        return set(self.adapters.values())

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # --- lifecycle ----------------------------------------------------------------------------------

    def start(self, wait: bool = True, timeout: float = 1800.0) -> None:
        with self._lock:
            if self.is_alive():
                return
            self._resolve_mode()
            self._before_start()
            # Kept even without a log dir (in the work dir then): why a start failed is read from it.
            log_dir = self.log_dir or self.work_dir
            log_dir.mkdir(parents=True, exist_ok=True)
            if self._log_file is None:
                self._log_path = log_dir / f"{self.engine.lower()}-{self.port}.log"
                self._log_file = open(self._log_path, "ab")
            self._log_start = os.fstat(self._log_file.fileno()).st_size
            logger.info(
                "starting %s on port %s (%s mode): %s", self.engine, self.port, self.adapter_mode, self.command()
            )
            self._proc = subprocess.Popen(
                self.command(),
                env=self.environment(),
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=functools.partial(_child_setup, self.cpus, self.nice),
            )
            self.adapters = {}
            self._loaded = None
        if wait:
            self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = 1800.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.is_alive():
                # What it had started (vLLM's engine and workers) goes too, giving back its memory now.
                _kill_group(self._proc.pid)
                raise InferenceServerError(self._start_failure())
            try:
                if self._http.get(f"{self.root_url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise InferenceServerError(f"{self.engine} did not become healthy within {timeout:g} s.")

    def _start_failure(self) -> str:
        """What a person is told when the process exited while starting: the error it ended on, read from
        its output, in words they can act on; the log itself is for operators, who find it named here."""
        status = self._proc.returncode if self._proc else None
        reason = start_failure_reason(self._log_tail())
        logger.warning("%s exited with status %s while starting; its output: %s", self.engine, status, self._log_path)
        if reason is None:
            return (
                f"{self.engine} stopped while starting the model {self.base_model_name} (exit status {status}) "
                "without saying why; an administrator finds its output in the worker's logs."
            )
        hint = next((advice for pattern, advice in START_FAILURE_HINTS if pattern.search(reason)), "")
        return f"{self.engine} could not start the model {self.base_model_name}: {reason.rstrip('.')}. {hint}".strip()

    def _log_tail(self, limit: int = 256 * 1024) -> str:
        """The last `limit` bytes of what the process wrote since this start."""
        if self._log_path is None:
            return ""
        try:
            with open(self._log_path, "rb") as log:
                size = log.seek(0, os.SEEK_END)
                log.seek(max(self._log_start, size - limit))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def ensure_running(self) -> None:
        """Restart the server if it died, putting back the policy it was serving."""
        with self._lock:
            if self.is_alive():
                return
            if self._proc is not None:
                logger.warning("%s exited with status %s; restarting", self.engine, self._proc.returncode)
                # Its engine and worker processes outlive a server that was killed: end them, so they give
                # back their memory and nothing answers on the port but the new server.
                _kill_group(self._proc.pid)
            previous = dict(self.adapters)
            self.start()
            for name, path in previous.items():
                self.load_adapter(name, path)

    def stop(self, timeout: float = 30.0) -> None:
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                os.killpg(self._proc.pid, signal.SIGTERM)
                try:
                    self._proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                    self._proc.wait(timeout=10)
            if self._proc is not None:
                _kill_group(self._proc.pid)  # whatever of it is left (a server that died alone)
            self._proc = None
            if self._log_file:
                self._log_file.close()
                self._log_file = None
            self.adapters = {}
            self._loaded = None
            if self._own_work_dir and self._work_dir is not None:
                shutil.rmtree(self._work_dir, ignore_errors=True)
                self._work_dir = None

    # --- policies -----------------------------------------------------------------------------------

    def ensure_base(self) -> str:
        """Serve the base model and return its name (in merged mode this may reload the weights)."""
        with self._lock:
            if self.merged and self._loaded is not None:
                if not self._push_weights(self.base_model_name, None):
                    self._swap_weights(self.base_model_name, None)
                self._loaded = None
                self.adapters = {}
            return self.base_model_name

    def ensure_adapter(self, name: str, path: str) -> str:
        """Serve adapter `path` as `name` unless it already is; return the name to request."""
        with self._lock:
            if self.adapters.get(name) == str(path):
                return name
            return self.load_adapter(name, path)

    def load_adapter(self, name: str, path: str) -> str:
        """Serve a LoRA checkpoint directory under `name`; returns the name to request."""
        path = str(path)
        with self._lock:
            if not self.merged:
                self._load_lora(name, path)
                self.adapters[name] = path
                return name
            t0, target = time.perf_counter(), None
            if not self._push_weights(name, path):
                target = self.work_dir / "merged" / _safe(name)
                if not self._rewrite_merged(target, path):
                    shutil.rmtree(target, ignore_errors=True)
                    merge_adapter(self.model_path, path, target)
                self._merged_dir = target
            self._serve_weights(name, path, target)
            logger.info("serving %s (merged) after %.1f s", name, time.perf_counter() - t0)
            return name

    def _rewrite_merged(self, target: Path, path: str) -> bool:
        """Merged mode: write adapter `path` over the merged copy this server made last (moved to target
        first), which the server no longer reads once its weights are loaded; False when there is none."""
        own, self._merged_dir = self._merged_dir, None
        if own is None or not own.is_dir():
            return False
        if own != target:
            shutil.rmtree(target, ignore_errors=True)
            own.rename(target)
        return rewrite_merged(self.model_path, path, target)

    def load_merged(self, name: str, path: str, weights_dir: str) -> str:
        """Merged mode: serve weights already merged from adapter `path` (in weights_dir) as `name`.

        For callers that keep merged copies of their own (rollouts.inference.adapter_cache); the directory
        stays theirs. A later ensure_adapter(name, path) finds the policy loaded and does nothing."""
        path = str(path)
        with self._lock:
            if not self.merged:
                raise InferenceServerError("load_merged is for a server in merged mode")
            self._serve_weights(name, path, weights_dir)
            return name

    def _serve_weights(self, name: str, path: str, weights_dir: str | os.PathLike | None) -> None:
        """Merged mode, under the lock: load the weights in weights_dir (None: pushed already) and answer to
        `name` (adapter `path`) alone; the previous policy's merged copy, when this server made it, is removed."""
        if weights_dir is not None:
            self._swap_weights(name, str(weights_dir))
        previous = self._loaded
        self._loaded = (name, path)
        self.adapters = {name: path}
        if previous is not None and _safe(previous[0]) != _safe(name):
            shutil.rmtree(self.work_dir / "merged" / _safe(previous[0]), ignore_errors=True)

    def _push_weights(self, name: str, path: str | None) -> bool:
        """Merged mode: serve the base with adapter `path` (None: alone) as `name` from weights in memory, no
        copy on disk; False where this server cannot (vllm_server can on a GPU): the caller then loads the whole
        policy from disk, which replaces whatever a failed copy changed."""
        return False

    def _load_lora(self, name: str, path: str) -> None:
        raise InferenceServerError(f"{self.engine} serves adapters merged only")

    def _unload_lora(self, name: str) -> None:
        raise InferenceServerError(f"{self.engine} serves adapters merged only")

    def unload_adapter(self, name: str) -> None:
        with self._lock:
            if name not in self.adapters:
                return
            if self.merged:
                self.ensure_base()
            else:
                self._unload_lora(name)
                del self.adapters[name]

    def retire_adapters(self, keep: set[str]) -> None:
        """Unload every adapter except those in keep (old steps of a run) and the endpoint's (SERVING_PREFIX)."""
        for name in list(self.adapters):  # each unloaded under the lock, as it is there still
            if name not in keep and not name.startswith(SERVING_PREFIX):
                self.unload_adapter(name)

    # --- helpers ------------------------------------------------------------------------------------

    def _post(self, route: str, body: dict | None) -> httpx.Response:
        response = self._http.post(f"{self.root_url}{route}", json=body, headers=self.headers)
        if response.status_code != 200:
            raise InferenceServerError(f"{self.engine} {route} failed ({response.status_code}): {response.text[:1000]}")
        return response


# --- why a start failed --------------------------------------------------------------------------------
# The servers print Python tracebacks, vLLM's with a prefix on each line ("(EngineCore pid=12) ERROR 12-06
# 01:26:52 [core.py:1510] "). The root cause is the last exception line that is not a wrapper: vLLM's
# processes each re-raise a worker's error as "... See root cause above." or "... See stack trace for root
# cause.", after the worker's own.

_LOG_PREFIX = re.compile(r"^(?:\(\w+ pid=\d+\)\s*)?(?:[A-Z]+ \d\d-\d\d [\d:.]+ \[[^\]]*\]\s*)?")
_EXCEPTION_LINE = re.compile(r"^((?:[A-Za-z_][\w.]*)?(?:Error|Exception)): (.+)$")
_WRAPPER = re.compile(r"root cause|see stack trace", re.IGNORECASE)
_PYDANTIC = re.compile(r"^\d+ validation errors? for ")
# A path on the server: "/" after a space, a quote or a bracket (not a URL's "//"), up to a space or a quote.
_HOST_PATH = re.compile(r"(?<![\w.:/~-])(?:~|\.{1,2})?/[^\s'\"`,:;()\[\]{}<>|]+")
MAX_REASON = 400

# (what the reason says, what the person can do about it), the first that matches.
START_FAILURE_HINTS = [
    (
        re.compile(r"out of memory|cannot allocate memory|MemoryError|no available memory|not enough memory", re.I),
        "The model does not fit in the worker's memory: pick a smaller model or a shorter max length, or ask an "
        "administrator for more memory.",
    ),
    (
        re.compile(r"max_model_len|max_seq_len|maximum model length|max_position_embeddings", re.I),
        "Lower the base model's max length to what the model supports.",
    ),
    (
        re.compile(r"architectures? .*(not supported|unsupported)", re.I),
        "The inference server cannot serve this model's architecture: pick a model of a supported one (Llama, "
        "Qwen2, Mistral, ...).",
    ),
    (
        re.compile(
            r"cannot find any model weights|no such file|not a valid model identifier|LocalEntryNotFound|"
            r"huggingface\.co|offline mode",
            re.I,
        ),
        "The model's files are missing on the worker: ask an administrator to download the model into the "
        "workers' Hugging Face cache.",
    ),
]


def start_failure_reason(output: str) -> str | None:
    """The error a server's output ends on ("ValueError: ..."), without the server's paths; None when it
    holds none."""
    lines = [_LOG_PREFIX.sub("", line).rstrip() for line in output.splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        match = _EXCEPTION_LINE.match(lines[i])
        if not match or _WRAPPER.search(match.group(2)):
            continue
        name, text = match.groups()
        if _PYDANTIC.match(text):  # the errors are on the indented lines below: "  Value error, ..."
            details = [line.strip() for line in lines[i + 1 : i + 6] if line.startswith(" ")]
            text = " ".join([text.rstrip(), *[d for d in details if not d.startswith("For further information")]])
        reason = without_host_paths(f"{name.rsplit('.', 1)[-1]}: {text}")
        return reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 1] + "…"
    return None


def without_host_paths(text: str) -> str:
    """text with each absolute path on the server cut to its last part ("…/model.safetensors")."""
    return _HOST_PATH.sub(lambda m: "…/" + m.group(0).rstrip("/").rsplit("/", 1)[-1], text)


_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: nothing may import between fork and exec


def _kill_group(pgid: int) -> None:
    """SIGKILL what is left of a server's process group (the server leads its own session)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_PR_SET_PDEATHSIG = 1


def _child_setup(cpus: tuple[int, ...] | None, nice: int) -> None:
    """In the child before exec: SIGTERM when the thread that started it ends (start() runs on the worker's
    long-lived task thread), so a worker killed outright (SIGKILL, a task time limit) never leaves a server
    holding its port; `cpus` alone and `nice` where given (its children inherit both)."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if cpus:
        os.sched_setaffinity(0, cpus)
    if nice:
        with contextlib.suppress(OSError):  # a raised priority needs CAP_SYS_NICE; without it, the usual one
            os.setpriority(os.PRIO_PROCESS, 0, nice)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
