"""Start vLLM's OpenAI-compatible server; run as a script by the interpreter that has vLLM.

In merged-weights mode the server holds one set of weights (the base model or a step's policy merged
into it) and must answer to that policy's name, e.g. "run-12@3", which is only known at step time.
vLLM accepts a fixed list of served names, so when ARTWEB_VLLM_ALIASES names a JSON file, the names
listed there are accepted as well; VLLMServer rewrites that file when it swaps the weights.
"""

import json
import os
import runpy
import sys


def accept_aliases(path: str) -> None:
    try:
        from vllm.entrypoints.openai.models.serving import OpenAIModelRegistry
    except ImportError as exc:  # another vLLM layout: say which mode works instead
        raise SystemExit(f"This vLLM version has no OpenAIModelRegistry ({exc}); use adapter_mode='lora'.")

    original = OpenAIModelRegistry.is_base_model
    cache = {"stamp": None, "names": frozenset()}

    def aliases() -> frozenset:
        try:
            stamp = os.stat(path).st_mtime_ns
        except FileNotFoundError:
            return frozenset()
        if stamp != cache["stamp"]:
            with open(path) as fh:
                cache.update(stamp=stamp, names=frozenset(json.load(fh)))
        return cache["names"]

    def is_base_model(self, model_name: str) -> bool:
        return original(self, model_name) or model_name in aliases()

    OpenAIModelRegistry.is_base_model = is_base_model


if __name__ == "__main__":
    # vLLM's engine runs in spawned processes that import this file as __mp_main__: keep all of this
    # under the guard so they do not start servers of their own.
    if os.environ.get("ARTWEB_VLLM_ALIASES"):
        accept_aliases(os.environ["ARTWEB_VLLM_ALIASES"])
    sys.argv = ["vllm.entrypoints.openai.api_server", *sys.argv[1:]]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
