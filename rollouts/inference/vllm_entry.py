"""Start vLLM's OpenAI-compatible server; run as a script by the interpreter that has vLLM.

In merged-weights mode the server holds one set of weights (the base model or a step's policy merged
into it) and must answer to that policy's name, e.g. "run-12@3", which is only known at step time.
vLLM accepts a fixed list of served names, so when ARTWEB_VLLM_ALIASES names a JSON file, the names
listed there are accepted as well; VLLMServer rewrites that file when it swaps the weights.

When ARTWEB_VLLM_WEIGHT_PUSH names a weight-transfer backend (a GPU server in merged mode), that name is
registered for rollouts.inference.vllm_weights in every process of the server, before vLLM makes its engine.

Every route but /health needs the key in VLLM_API_KEY (RequireApiKey, below): vLLM's own key check
covers only paths under /v1, /v2, /inference and /cohere, which leaves /collective_rpc, /sleep,
/reset_prefix_cache, /pause, /metrics, /tokenize and the rest open to anything that reaches the port.
"""

import hmac
import json
import os
import runpy
import sys
from pathlib import Path

# Polled by VLLMServer.wait_healthy before it has anything to send; it reveals nothing but "up".
OPEN_PATHS = frozenset({"/health"})
UNAUTHORIZED_BODY = json.dumps(
    {"error": {"message": "A valid API key is required.", "type": "authentication_error", "code": "invalid_api_key"}}
).encode()
UNAUTHORIZED_HEADERS = [
    (b"content-type", b"application/json"),
    (b"www-authenticate", b"Bearer"),
    (b"content-length", str(len(UNAUTHORIZED_BODY)).encode()),
]


class RequireApiKey:
    """ASGI middleware: refuse any request to a route outside OPEN_PATHS without "Authorization: Bearer
    <VLLM_API_KEY>", whatever its method (vLLM's own check lets OPTIONS through), before vLLM's routes
    and its other middleware see it."""

    def __init__(self, app, key: str | None = None) -> None:
        """key: what callers must send; None reads VLLM_API_KEY (vLLM builds its middleware itself)."""
        self.app = app
        key = os.environ.get("VLLM_API_KEY", "") if key is None else key
        if not key:
            raise RuntimeError("The server's API key is empty: it would accept any caller.")
        self._expected = key.encode()

    def _authorized(self, scope) -> bool:
        value = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
        scheme, _, token = value.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._expected)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await receive()  # websocket.connect; closing before accepting answers the handshake with 403
            await send({"type": "websocket.close", "code": 1008})
        else:
            await send({"type": "http.response.start", "status": 401, "headers": UNAUTHORIZED_HEADERS})
            await send({"type": "http.response.body", "body": UNAUTHORIZED_BODY})


def accept_aliases(path: str) -> None:
    try:
        from vllm.entrypoints.openai.models.serving import OpenAIModelRegistry
    except ImportError as exc:  # another vLLM layout: say which mode works instead
        raise SystemExit(f"This vLLM version has no OpenAIModelRegistry ({exc}); use adapter_mode='lora'.") from exc

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


def register_weight_push(name: str) -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(name, "rollouts.inference.vllm_weights", "SharedWeightsEngine")
    except ValueError:  # registered already: a process forked from one that imported this file
        pass


# At import, outside the guard below: vLLM's spawned processes import this file too.
if os.environ.get("ARTWEB_VLLM_WEIGHT_PUSH"):
    register_weight_push(os.environ["ARTWEB_VLLM_WEIGHT_PUSH"])


if __name__ == "__main__":
    # vLLM's engine runs in spawned processes that import this file as __mp_main__: keep all of this
    # under the guard so they do not start servers of their own.
    if not os.environ.get("VLLM_API_KEY"):
        raise SystemExit("Set VLLM_API_KEY: this server answers only callers that hold it.")
    if os.environ.get("ARTWEB_VLLM_ALIASES"):
        accept_aliases(os.environ["ARTWEB_VLLM_ALIASES"])
    # vLLM imports --middleware by module path; this file's directory is sys.path[0] when run as a
    # script, so it imports as its own stem. vLLM adds these last, so they wrap everything else.
    middleware = f"{Path(__file__).stem}.{RequireApiKey.__name__}"
    sys.argv = ["vllm.entrypoints.openai.api_server", *sys.argv[1:], "--middleware", middleware]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
