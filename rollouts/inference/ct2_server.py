"""The CTranslate2 inference server (rollouts.inference.ct2_entry) as the worker drives it.

The same interface as VLLMServer (rollouts.inference.inference_server): start, stop, restart after a
death, serve the base model or a step's policy under its name. Policies are served merged (the adapter
folded into the base weights), one at a time, as on vLLM's CPU build; the server converts them to its
own format in memory on each load (about 1 s for the default model).

The server runs in the worker's own interpreter (it needs ctranslate2, torch and transformers, which a
CPU worker has), started in the project's directory so that `python -m` finds the entry.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from rollouts.inference.inference_server import InferenceServer
from rollouts.inference.vllm_server import TOOLS_TEMPLATE, template_supports_tools

PROJECT_ROOT = Path(__file__).resolve().parents[2]
logger = logging.getLogger(__name__)


class CT2Server(InferenceServer):
    engine = "CTranslate2"
    cwd = str(PROJECT_ROOT)  # `python -m` imports the entry's package from here

    def __init__(
        self,
        model_path: str,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        served_model_name: str | None = None,
        max_model_len: int | None = None,
        chat_template: str | None = None,
        compute_type: str = "float32",
        threads: int = 0,
        extra_env: dict[str, str] | None = None,
        log_dir: str | None = None,
        work_dir: str | None = None,
        api_key: str | None = None,
        cpus: list[int] | None = None,
    ) -> None:
        """model_path: a local model directory. chat_template: a Jinja file; None uses the model's own, or
        artweb's ChatML-with-tools template when the model's cannot render tools (as VLLMServer does).
        compute_type: CTranslate2's ("float32" keeps the policy's numbers; "int8_float32" is faster and
        samples from a quantized policy). threads: 0 for one per core. cpus: the only cores the process runs
        on (None: the worker's), one thread each unless threads says otherwise."""
        super().__init__(
            model_path,
            host=host,
            port=port,
            served_model_name=served_model_name,
            adapter_mode="merged",
            log_dir=log_dir,
            work_dir=work_dir,
            api_key=api_key,
            cpus=cpus,
        )
        self.max_model_len = max_model_len
        self.chat_template = chat_template
        self.compute_type = compute_type
        self.threads = threads or len(self.cpus or ())
        self.extra_env = dict(extra_env or {})

    def command(self) -> list[str]:
        template = self.chat_template
        if template is None and not template_supports_tools(self.model_path):
            template = str(TOOLS_TEMPLATE)
        args = [
            sys.executable,
            "-m",
            "rollouts.inference.ct2_entry",
            "--model",
            self.model_path,
            "--served-model-name",
            self.base_model_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--compute-type",
            self.compute_type,
            "--threads",
            str(self.threads),
            "--work-dir",
            str(self.work_dir / "engine"),
        ]
        if self.max_model_len:
            args += ["--max-model-len", str(self.max_model_len)]
        if template:
            args += ["--chat-template", template]
        return args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("HF_HUB_OFFLINE", "1" if Path(self.model_path).exists() else "0")
        # Loads run on the event loop's worker threads, one glibc arena each: without a cap, every load's
        # freed copies of the weights stay spread over new arenas (seen: 7.9 GB resident after a dozen).
        env.setdefault("MALLOC_ARENA_MAX", "2")
        # What a load frees stays with the process for the next load (Engine.__init__): weights up to
        # 32 MiB come from the heap rather than their own mappings (glibc's largest threshold), and the
        # heap keeps up to 1 GiB free at its top instead of giving it back at once.
        env.setdefault("MALLOC_MMAP_THRESHOLD_", str(32 << 20))
        env.setdefault("MALLOC_TRIM_THRESHOLD_", str(1 << 30))
        env.update(self.extra_env)
        # In the environment, not on the command line, where any local user could read it (ps, /proc).
        env["ARTWEB_INFERENCE_API_KEY"] = self.api_key
        return env

    def _swap_weights(self, name: str, weights_dir: str | None) -> None:
        self._post("/artweb/load", {"name": name, "weights_dir": weights_dir})

    def load_adapter(self, name: str, path: str) -> str:
        """Serve a LoRA checkpoint directory under `name`: the server folds it into the base weights itself,
        in float32 and in memory (no merged copy written and read back, as other servers need)."""
        path = str(path)
        with self._lock:
            t0 = time.perf_counter()
            self._post("/artweb/load", {"name": name, "adapter_dir": path})
            self._loaded = (name, path)
            self.adapters = {name: path}
            logger.info("serving %s after %.1f s", name, time.perf_counter() - t0)
            return name
