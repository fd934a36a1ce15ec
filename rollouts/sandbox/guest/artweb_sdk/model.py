"""The model handle a rollout receives, and the OpenAI client it hands out.

`model.openai_client()` is an ordinary `AsyncOpenAI` pointed at the run's inference endpoint. Its
HTTP transport adds what training needs to every chat completion request — the run's sampling
defaults, logprobs, and vLLM's `return_token_ids` so each Choice carries its sampled token ids — and
counts the tokens each rollout used. The script's own arguments win over the sampling defaults.

In the sandbox, that client reaches the inference proxy over its unix socket itself rather than
through the guest's TCP relay on 127.0.0.1, which any other client uses: the same socket and the same
proxy checks, without a second hop through the relay's thread for every request and reply.
"""

from __future__ import annotations

import contextvars
import functools
import json
import os
import re
import ssl
from dataclasses import dataclass, field
from typing import Any

import httpx

from .errors import NotSupportedInSandbox, training_is_artweb_s


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0


# The usage counter of the rollout running in the current asyncio task (None outside a rollout).
current_usage: contextvars.ContextVar[Usage | None] = contextvars.ContextVar("artweb_usage", default=None)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default TLS context, built once per process: each transport would load the CA bundle again
    (about 50 ms), and a pre-started sandbox builds it before its batch arrives."""
    return httpx.create_ssl_context()


class _PolicyTransport(httpx.AsyncBaseTransport):
    """Completes each chat completion request with the run's defaults and records its token usage."""

    def __init__(self, sampling: dict, max_connections: int, socket_path: str | None = None) -> None:
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        # uds: every connection goes to that unix socket, whatever host the URL names.
        self._inner = httpx.AsyncHTTPTransport(limits=limits, uds=socket_path, verify=_tls_context())
        self._sampling = dict(sampling)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method != "POST" or not request.url.path.endswith("/chat/completions"):
            return await self._inner.handle_async_request(request)
        body = json.loads(await request.aread() or b"{}")
        for key, value in self._sampling.items():
            if key == "max_tokens" and "max_completion_tokens" in body:
                continue
            body.setdefault(key, value)
        body["logprobs"] = True
        body["return_token_ids"] = True
        headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() != "content-length"]
        request = httpx.Request(
            "POST", request.url, headers=headers, content=json.dumps(body).encode(), extensions=request.extensions
        )
        response = await self._inner.handle_async_request(request)
        usage = current_usage.get()
        if usage is not None and not body.get("stream") and response.status_code == 200:
            # Reading here keeps the body cached on the response; the OpenAI client reads that copy.
            await response.aread()
            counts = json.loads(response.content).get("usage") or {}
            usage.prompt_tokens += int(counts.get("prompt_tokens") or 0)
            usage.completion_tokens += int(counts.get("completion_tokens") or 0)
            usage.requests += 1
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class Endpoint:
    """Where the policy is served, and the defaults merged into every request."""

    base_url: str
    api_key: str = "artweb"
    sampling: dict = field(default_factory=dict)
    max_connections: int = 64
    timeout_s: float = 600.0
    # The inference proxy's unix socket, which base_url (the guest's relay) leads to; None: connect to
    # base_url over TCP.
    socket_path: str | None = None

    @classmethod
    def from_env(cls) -> Endpoint:
        return cls(
            base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"),
            api_key=os.environ.get("OPENAI_API_KEY", "artweb"),
            sampling=json.loads(os.environ.get("ARTWEB_SAMPLING", "{}")),
            socket_path=os.environ.get("ARTWEB_PROXY_SOCKET") or None,
        )


class Model:
    """A served model: `name` is what to pass as `model=` to chat.completions.create."""

    def __init__(
        self,
        name: str,
        project: str = "artweb",
        config: Any = None,
        base_model: str | None = None,
        inference_base_url: str | None = None,
        inference_api_key: str | None = None,
        inference_model_name: str | None = None,
        trainable: bool = False,
        _endpoint: Endpoint | None = None,
        **extra: Any,
    ) -> None:
        self.name = name
        self.project = project
        self.config = config
        self.base_model = base_model
        self.trainable = trainable
        self.extra = extra
        self._endpoint = _endpoint or Endpoint.from_env()
        self.inference_base_url = inference_base_url or self._endpoint.base_url
        self.inference_api_key = inference_api_key or self._endpoint.api_key
        self.inference_model_name = inference_model_name or name
        self._client = None
        self.http_client: httpx.AsyncClient | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    def get_inference_name(self, step: int | None = None) -> str:
        """The name to send as `model=`. step: a checkpoint's step; only the one this batch serves exists
        in the sandbox (the served name's `@<step>`, or 0 for the base model)."""
        if step is None or step == served_step(self.inference_model_name):
            return self.inference_model_name
        raise NotSupportedInSandbox(
            f"get_inference_name(step={step})",
            f"this batch is served only {self.inference_model_name!r}, the checkpoint of step "
            f"{served_step(self.inference_model_name)}; no other checkpoint can be reached from a rollout.",
            "Call get_inference_name() without a step.",
        )

    def openai_client(self):
        """One AsyncOpenAI client per model handle, shared by all the rollouts that use it."""
        if self._client is None:
            from openai import AsyncOpenAI

            # The socket only stands for the endpoint's own URL: a handle given another server keeps TCP.
            direct = self.inference_base_url == self._endpoint.base_url
            transport = _PolicyTransport(
                self._endpoint.sampling,
                self._endpoint.max_connections,
                socket_path=self._endpoint.socket_path if direct else None,
            )
            # Kept for other OpenAI-based clients on the policy (art.langgraph's) to share its transport.
            self.http_client = httpx.AsyncClient(transport=transport, timeout=self._endpoint.timeout_s)
            self._client = AsyncOpenAI(
                base_url=self.inference_base_url,
                api_key=self.inference_api_key,
                http_client=self.http_client,
                # A rollout's wall-clock limit bounds retries anyway; retrying hides server trouble.
                max_retries=1,
            )
        return self._client

    def litellm_completion_params(self, step: int | None = None) -> dict:
        return {
            "model": f"hosted_vllm/{self.get_inference_name(step)}",
            "api_base": self.inference_base_url,
            "api_key": self.inference_api_key,
            **self._endpoint.sampling,
        }

    async def register(self, backend: Any = None, **_: Any) -> None:
        """Nothing to do: artweb has already registered the model with its inference server."""

    async def get_step(self) -> int:
        return int(os.environ.get("ARTWEB_STEP", "0"))

    async def log(self, *_: Any, **__: Any) -> None:
        """Metrics are recorded by artweb from the returned trajectories."""

    def read_state(self) -> Any:
        raise _no_state("model.read_state()")

    def write_state(self, state: Any) -> None:
        raise _no_state("model.write_state(...)")

    def overwrite_state(self, state: Any) -> None:
        raise _no_state("model.overwrite_state(...)")

    def merge_state(self, state: Any) -> Any:
        raise _no_state("model.merge_state(...)")


class TrainableModel(Model):
    def __init__(self, name: str, project: str = "artweb", base_model: str | None = None, **kwargs: Any) -> None:
        super().__init__(name=name, project=project, base_model=base_model, trainable=True, **kwargs)

    async def train(self, *_: Any, **__: Any) -> None:
        raise training_is_artweb_s("model.train(...)")

    async def train_sft(self, *_: Any, **__: Any) -> None:
        raise NotSupportedInSandbox(
            "model.train_sft(...)",
            "artweb trains with reinforcement learning from the run's rollouts; it has no supervised fine-tuning.",
        )

    async def delete_checkpoints(self, *_: Any, **__: Any) -> None:
        raise training_is_artweb_s("model.delete_checkpoints(...)")


def _no_state(feature: str) -> NotSupportedInSandbox:
    return NotSupportedInSandbox(
        feature,
        "ART keeps it in a model directory on disk; a sandbox starts empty for every batch, so it would not last.",
        "Keep what must last in the scenarios, or in the trajectory's metadata.",
    )


def served_step(name: str) -> int:
    """The checkpoint step in a served name (`run-12@3` -> 3); a base model (no `@<step>`) is step 0."""
    found = re.search(r"@(\d+)$", name)
    return int(found.group(1)) if found else 0


class Backend:
    """Accepted so ART scripts import and build one; artweb owns the backend, and training through one
    raises."""

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    async def register(self, model: Any) -> None:
        """Nothing to do: artweb has already registered the model with its inference server."""

    async def train(self, *_: Any, **__: Any) -> Any:
        raise training_is_artweb_s("backend.train(...)")

    async def close(self) -> None:
        pass

    async def __aenter__(self) -> Backend:
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()


class LocalBackend(Backend):
    pass


class ServerlessBackend(Backend):
    pass
