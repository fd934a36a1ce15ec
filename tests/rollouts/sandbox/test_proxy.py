"""The inference proxy between a jailed rollout and the model servers.

Against a small real HTTP server standing in for vLLM (it answers /v1/chat/completions, streams SSE,
and records every request and the Authorization header it got), reached over the proxy's unix socket
by httpx and the openai client as a rollout would; and once against the session's real vLLM server.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from aiohttp import web

from rollouts.sandbox.proxy import InferenceProxy, Upstream
from tests.rollouts.sandbox.threaded_server import ThreadedServer

WORKER_KEY = "worker-secret"
CALLER_KEY = "whatever-the-script-sends"


class FakeUpstream(ThreadedServer):
    """An OpenAI-compatible server in a thread of its own. A streamed reply sends one chunk, then waits
    for `release` before the rest, so a test can see what arrived while the upstream was still busy."""

    def __init__(self) -> None:
        super().__init__("fake-upstream")
        self.requests: list[dict] = []
        self.release = threading.Event()
        self.sent_rest = threading.Event()  # set before a streamed reply's chunks after the first
        self.disconnected = threading.Event()  # a streamed reply's client went away before its end
        self.delay_s = 0.0  # before a non-streamed reply

    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{tail:.*}", self._handle)

    def stop(self) -> None:
        self.release.set()
        super().stop()

    async def _cleanup(self) -> None:
        await super()._cleanup()
        # A handler still sleeping (the slow-reply test) would otherwise die with the loop, noisily.
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        self.requests.append(
            {
                "method": request.method,
                "path": request.path,
                "body": body,
                "authorization": request.headers.get("Authorization"),
            }
        )
        if request.path not in ("/v1/chat/completions", "/v1/completions"):
            return web.json_response({"reached": request.path})
        if body.get("stream"):
            return await self._stream(request, body)
        await asyncio.sleep(self.delay_s)
        return web.json_response(_completion(body["model"], f"auth={request.headers.get('Authorization')}"))

    async def _stream(self, request: web.Request, body: dict) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            await response.write(_sse(_chunk(body["model"], "first")))
            while not self.release.is_set():
                await asyncio.sleep(0.02)
                if request.transport is None or request.transport.is_closing():
                    self.disconnected.set()
                    return response
            self.sent_rest.set()
            for word in (" second", " third"):
                await response.write(_sse(_chunk(body["model"], word)))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:
            self.disconnected.set()
        return response


def _completion(model: str, content: str) -> dict:
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _chunk(model: str, content: str) -> dict:
    return {
        "id": "cmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }


def _sse(data: dict) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


@pytest.fixture
def upstream():
    server = FakeUpstream().start()
    yield server
    server.stop()


@pytest.fixture
def proxy():
    proxy = InferenceProxy(max_body_bytes=64 << 10)
    yield proxy
    proxy.shutdown()


@pytest.fixture
def socket_dir():
    # Not tmp_path: a unix socket's path must stay under 108 bytes.
    path = Path(tempfile.mkdtemp(prefix="artweb-proxy-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def served(proxy, upstream, socket_dir):
    path = socket_dir / "batch.sock"
    proxy.open(path, {"run-1@3": Upstream(upstream.base_url, api_key=WORKER_KEY)})
    return path


def http(path: Path, **kwargs) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://proxy/v1", timeout=10, **kwargs)


def openai_client(path: Path) -> openai.OpenAI:
    return openai.OpenAI(
        base_url="http://proxy/v1",
        api_key=CALLER_KEY,
        max_retries=0,
        http_client=httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), timeout=10),
    )


def chat(model: str = "run-1@3", **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def test_it_passes_an_allowed_model_with_the_workers_key_not_the_callers(served, upstream):
    completion = openai_client(served).chat.completions.create(**chat())
    assert completion.choices[0].message.content == f"auth=Bearer {WORKER_KEY}"
    [seen] = upstream.requests
    assert (seen["method"], seen["path"]) == ("POST", "/v1/chat/completions")
    assert seen["authorization"] == f"Bearer {WORKER_KEY}"
    assert seen["body"] == {**chat(), "logprobs": True, "return_token_ids": True}  # asked for every turn


def test_it_passes_legacy_completions(served, upstream):
    with http(served) as client:
        response = client.post("/completions", json={"model": "run-1@3", "prompt": "hi"})
    assert response.status_code == 200
    assert [r["path"] for r in upstream.requests] == ["/v1/completions"]


def test_it_refuses_a_model_the_socket_does_not_allow(served, upstream, proxy):
    with http(served) as client:
        response = client.post("/chat/completions", json=chat("run-2@7"))
        missing = client.post("/chat/completions", json={"messages": []})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and error["type"] == "invalid_request_error"
    assert "`run-2@7` does not exist" in error["message"] and "This batch may use: run-1@3" in error["message"]
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError, match="run-2@7"):
        openai_client(served).chat.completions.create(**chat("run-2@7"))
    assert upstream.requests == []
    assert proxy.stats(served) == {"requests": 3, "refused": 3}


def test_it_refuses_a_chat_template_of_the_callers_own(served, upstream):
    """vLLM would render a request's own Jinja template: code of the caller's choosing in the server."""
    with http(served) as client:
        response = client.post("/chat/completions", json=chat(chat_template="{{ cycler.__init__.__globals__ }}"))
    assert response.status_code == 400 and response.json()["error"]["code"] == "field_not_allowed"
    assert upstream.requests == []


def test_it_sends_upstream_the_body_it_checked(served, upstream):
    """A duplicated "model" key is read one way by the proxy; the upstream must read it the same way."""
    raw = b'{"model": "run-2@7", "model": "run-1@3", "messages": []}'
    with http(served) as client:
        response = client.post("/chat/completions", content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 200
    assert upstream.requests[0]["body"] == {
        "model": "run-1@3",
        "messages": [],
        "logprobs": True,
        "return_token_ids": True,
    }


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/v1/load_lora_adapter"),
        ("POST", "/v1/unload_lora_adapter"),
        ("POST", "/collective_rpc"),
        ("POST", "/start_weight_update"),
        ("POST", "/update_weights"),
        ("POST", "/finish_weight_update"),
        ("POST", "/sleep"),
        ("POST", "/wake_up"),
        ("POST", "/reset_prefix_cache"),
        ("GET", "/metrics"),
        ("GET", "/docs"),
        ("GET", "/openapi.json"),
        ("POST", "/v1/embeddings"),
        ("GET", "/health"),
        ("GET", "/v1/chat/completions"),
        ("POST", "/v1/models"),
        ("POST", "/v1/chat/completions/"),
        ("POST", "/v1/../collective_rpc"),
        ("POST", "/v1/chat/completions/../../collective_rpc"),
    ],
)
def test_it_refuses_every_other_route(served, upstream, method, path):
    with http(served) as client:
        response = client.request(method, "http://proxy" + path, json=chat())
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "route_not_found"
    assert "passes only POST /v1/chat/completions, POST /v1/completions and GET /v1/models" in error["message"]
    assert upstream.requests == []


def test_it_refuses_an_oversized_body(served, upstream):
    big = chat(padding="x" * (64 << 10))
    with http(served) as client:
        declared = client.post("/chat/completions", json=big)
        # Sent chunked, with no Content-Length to refuse it by.
        chunked = client.post(
            "/chat/completions", content=iter([json.dumps(big).encode()]), headers={"Content-Type": "application/json"}
        )
    for response in (declared, chunked):
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"
    assert upstream.requests == []


def test_it_refuses_a_body_that_is_not_a_json_object(served, upstream):
    with http(served) as client:
        broken = client.post("/chat/completions", content=b"{not json")
        listed = client.post("/chat/completions", json=[chat()])
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_json"
    assert listed.status_code == 400
    assert upstream.requests == []


def test_it_lists_the_allowed_models_itself(served, upstream):
    models = openai_client(served).models.list()
    assert [m.id for m in models.data] == ["run-1@3"]
    with http(served) as client:
        assert client.get("/models/run-1@3").json()["id"] == "run-1@3"
        assert client.get("/models/run-2@7").status_code == 404
    assert upstream.requests == []


def test_a_streamed_reply_arrives_chunk_by_chunk(served, upstream):
    stream = openai_client(served).chat.completions.create(**chat(stream=True))
    chunks = iter(stream)
    first = next(chunks)
    # The upstream is still holding the rest back, so the first chunk came through unbuffered.
    assert first.choices[0].delta.content == "first" and not upstream.sent_rest.is_set()
    upstream.release.set()
    rest = [c.choices[0].delta.content for c in chunks]
    assert rest == [" second", " third"] and upstream.sent_rest.is_set()


def test_a_client_that_hangs_up_mid_stream_frees_the_upstream_connection(served, upstream):
    with http(served) as client, client.stream("POST", "/chat/completions", json=chat(stream=True)) as response:
        assert b"first" in next(response.iter_bytes())
    assert upstream.disconnected.wait(5)
    assert not upstream.sent_rest.is_set()


def test_close_aborts_requests_in_flight_and_removes_the_socket(served, upstream, proxy):
    errors = []

    def read_stream():
        try:
            with http(served) as client, client.stream("POST", "/chat/completions", json=chat(stream=True)) as r:
                for _ in r.iter_bytes():
                    pass
        except httpx.HTTPError as exc:
            errors.append(exc)

    reader = threading.Thread(target=read_stream)
    reader.start()
    deadline = time.monotonic() + 5
    while not upstream.requests and time.monotonic() < deadline:
        time.sleep(0.02)
    proxy.close(served)
    reader.join(5)
    assert errors and isinstance(errors[0], httpx.TransportError)
    assert upstream.disconnected.wait(5)
    assert not served.exists()
    with http(served) as client, pytest.raises(httpx.ConnectError):
        client.get("/models")
    proxy.close(served)  # again: nothing to do
    assert proxy.stats(served) == {"requests": 1, "refused": 0}


def test_two_sockets_serve_only_their_own_models(proxy, upstream, socket_dir):
    one, two = socket_dir / "one.sock", socket_dir / "two.sock"
    proxy.open(one, {"run-1@3": Upstream(upstream.base_url, api_key=WORKER_KEY)})
    proxy.open(two, {"run-2@7": Upstream(upstream.base_url, api_key=WORKER_KEY)})
    with http(one) as first, http(two) as second:
        assert first.post("/chat/completions", json=chat("run-1@3")).status_code == 200
        assert first.post("/chat/completions", json=chat("run-2@7")).status_code == 404
        assert second.post("/chat/completions", json=chat("run-2@7")).status_code == 200
        assert second.post("/chat/completions", json=chat("run-1@3")).status_code == 404
        assert [m["id"] for m in second.get("/models").json()["data"]] == ["run-2@7"]
    proxy.close(one)
    with http(two) as second:
        assert second.post("/chat/completions", json=chat("run-2@7")).status_code == 200
    assert [r["body"]["model"] for r in upstream.requests] == ["run-1@3", "run-2@7", "run-2@7"]


def test_the_socket_is_open_to_the_sandbox_user(served):
    assert served.stat().st_mode & 0o777 == 0o666


def test_an_unreachable_upstream_is_a_502(proxy, socket_dir):
    path = socket_dir / "dead.sock"
    proxy.open(path, {"m": Upstream("http://127.0.0.1:9/v1")})
    with http(path) as client:
        response = client.post("/chat/completions", json=chat("m"))
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "upstream_unreachable" and "Connection refused" in error["message"]
    assert "127.0.0.1" not in error["message"]


def test_a_slow_upstream_is_a_504(upstream, socket_dir):
    proxy = InferenceProxy(timeout_s=0.3)
    upstream.delay_s = 2.0
    try:
        proxy.open(socket_dir / "slow.sock", {"m": Upstream(upstream.base_url)})
        with http(socket_dir / "slow.sock") as client:
            response = client.post("/chat/completions", json=chat("m"))
    finally:
        proxy.shutdown()
    assert response.status_code == 504 and response.json()["error"]["code"] == "upstream_timeout"


def test_shutdown_closes_every_socket(proxy, upstream, socket_dir):
    paths = [socket_dir / f"{i}.sock" for i in range(3)]
    for path in paths:
        proxy.open(path, {"m": Upstream(upstream.base_url)})
    proxy.shutdown()
    assert not any(path.exists() for path in paths)


# As in rollouts/examples/tool_rollout.py: without the property's description the default model copies
# the schema into its arguments instead of filling it in.
LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_capital",
        "description": "Look up the capital city of a country.",
        "parameters": {
            "type": "object",
            "required": ["country"],
            "properties": {"country": {"type": "string", "description": "The country's name in English."}},
        },
    },
}


@pytest.mark.vllm
def test_it_serves_the_real_vllm_server_to_the_openai_client(vllm_server, proxy, socket_dir):
    model = vllm_server.ensure_base()
    path = socket_dir / "vllm.sock"
    proxy.open(path, {model: Upstream(vllm_server.base_url, api_key=vllm_server.api_key)})
    client = openai.OpenAI(
        base_url="http://proxy/v1",
        api_key=CALLER_KEY,
        max_retries=0,
        http_client=httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), timeout=300),
    )
    messages = [{"role": "user", "content": "Name three fruits."}]

    chunks = list(
        client.chat.completions.create(
            model=model, messages=messages, max_tokens=12, stream=True, logprobs=True, temperature=0.0
        )
    )
    content = [c.choices[0] for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) > 1
    assert all(choice.logprobs.content and choice.logprobs.content[0].logprob <= 0 for choice in content)

    completion = client.chat.completions.create(
        model=model,
        max_tokens=60,
        temperature=0.0,
        tools=[LOOKUP_TOOL],
        messages=[
            {"role": "system", "content": "Use the lookup_capital tool, then answer with the city's name."},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        tool_choice={"type": "function", "function": {"name": "lookup_capital"}},
    )
    [call] = completion.choices[0].message.tool_calls
    assert call.function.name == "lookup_capital"
    assert json.loads(call.function.arguments)["country"].lower() == "france"
    assert proxy.stats(path) == {"requests": 2, "refused": 0}


# --- what the proxy passes: fields, caps, nesting, redirects, and users' servers through the egress guard --


class Redirector(ThreadedServer):
    """Answers every request with `status` and a Location on another server."""

    def __init__(self, status: int, location: str) -> None:
        super().__init__("redirector")
        self.status, self.location = status, location
        self.requests = 0

    def routes(self, app: web.Application) -> None:
        async def handle(request: web.Request) -> web.Response:
            self.requests += 1
            return web.Response(status=self.status, headers={"Location": self.location}, text="moved along")

        app.router.add_route("*", "/{tail:.*}", handle)


@pytest.mark.parametrize("status", [302, 307])
@pytest.mark.parametrize("users_server", [False, True], ids=["workers-upstream", "judge-endpoint"])
def test_it_follows_no_redirect_of_an_upstream(proxy, upstream, socket_dir, status, users_server):
    """A judge endpoint that answers 302/307 toward a private server would make the worker fetch it (GET,
    or the body again) and stream that server's answer into the jail. The proxy answers with an error
    naming the redirect instead, and the second server hears nothing."""
    with Redirector(status, f"http://127.0.0.1:{upstream.port}/v1/chat/completions") as redirector:
        if users_server:
            from rollouts.sandbox.egress import EgressPolicy

            egress = {"egress": EgressPolicy.parse([f"127.0.0.1:{redirector.port}"])}
        else:
            egress = {}
        path = socket_dir / "redirect.sock"
        proxy.open(path, {"judge": Upstream(redirector.base_url, **egress)})
        with http(path) as client:
            response = client.post("/chat/completions", json=chat("judge"))
        assert redirector.requests == 1
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "upstream_redirect"
    assert f"answered HTTP {status}" in error["message"] and "a redirect to 127.0.0.1" in error["message"]
    assert "moved along" not in response.text
    assert upstream.requests == []


def test_a_users_server_at_a_private_address_is_refused_when_connecting(proxy, upstream, socket_dir):
    """The judge's URL was checked when saved; a name can point elsewhere since, so the proxy's own
    connection goes through the egress guard again."""
    from rollouts.sandbox.egress import EgressPolicy

    path = socket_dir / "judge.sock"
    proxy.open(path, {"judge": Upstream(upstream.base_url, egress=EgressPolicy())})
    with http(path) as client:
        response = client.post("/chat/completions", json=chat("judge"))
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "upstream_refused" and "127.0.0.1 is a loopback address" in error["message"]
    assert f"ARTWEB_EGRESS_ALLOW=127.0.0.1:{upstream.port}" in error["message"]
    assert upstream.requests == []
    proxy.close(path)
    proxy.open(path, {"judge": Upstream(upstream.base_url, egress=EgressPolicy.parse([f"127.0.0.1:{upstream.port}"]))})
    with http(path) as client:
        assert client.post("/chat/completions", json=chat("judge")).status_code == 200
    assert len(upstream.requests) == 1


@pytest.mark.parametrize(
    "field, value",
    [
        ("priority", -100),
        ("vllm_xargs", {"x": 1}),
        ("kv_transfer_params", {"do_remote_prefill": True}),
        ("chat_template_kwargs", {"chat_template": "{{ 7 * 7 }}"}),
        ("guided_json", {"type": "object"}),
        ("cache_salt", "x"),
    ],
)
def test_it_refuses_an_inference_servers_own_request_fields(served, upstream, field, value):
    with http(served) as client:
        response = client.post("/chat/completions", json=chat(**{field: value}))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "field_not_allowed" and f"field(s) {field} are not accepted" in error["message"]
    assert upstream.requests == []


def test_it_passes_vllms_sampling_options_that_shape_only_the_callers_completion(served, upstream):
    """Agent scripts pass these in extra_body; each bears on its own request only, within the token caps."""
    options = {
        "top_k": 20,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "min_tokens": 4,
        "ignore_eos": True,
        "stop_token_ids": [2],
        "skip_special_tokens": False,
        "spaces_between_special_tokens": True,
        "include_stop_str_in_output": True,
    }
    with http(served) as client:
        assert client.post("/chat/completions", json=chat(**options)).status_code == 200
        assert client.post("/chat/completions", json=chat(ignore_eos=True, priority=-1)).status_code == 400
    (sent,) = upstream.requests
    assert {k: sent["body"][k] for k in options} == options


def test_it_passes_the_openai_fields_rollouts_use(served, upstream):
    """What the SDK adds (logprobs, return_token_ids, the run's sampling) and what scripts and RULER send."""
    fields = {
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 64,
        "max_completion_tokens": 64,
        "n": 4,
        "seed": 1,
        "stop": ["\n"],
        "logprobs": True,
        "top_logprobs": 2,
        "return_token_ids": True,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.1,
        "user": "rollout-3",
        "tools": [LOOKUP_TOOL],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}},
        "stream": False,
        "stream_options": None,
    }
    with http(served) as client:
        assert client.post("/chat/completions", json=chat(**fields)).status_code == 200
        completion = {"model": "run-1@3", "prompt": "hi", "echo": False, "best_of": 2, "suffix": None}
        assert client.post("/completions", json=completion).status_code == 200
    assert upstream.requests[0]["body"] == chat(**fields)


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("n", 17, "n must be a whole number from 1 to 16"),
        ("n", 0, "n must be a whole number from 1 to 16"),
        ("n", "4", "n must be a whole number from 1 to 16"),
        ("max_tokens", 32_769, "max_tokens must be a whole number from 1 to 32768"),
        ("max_completion_tokens", 10**9, "max_completion_tokens must be a whole number from 1 to 32768"),
        ("max_tokens", True, "max_tokens must be a whole number"),
    ],
)
def test_it_caps_choices_and_tokens_per_request(served, upstream, field, value, says):
    with http(served) as client:
        response = client.post("/chat/completions", json=chat(**{field: value}))
    assert response.status_code == 400 and says in response.json()["error"]["message"]
    assert "the proxy's limit" in response.json()["error"]["message"]
    assert upstream.requests == []


def test_it_caps_the_requests_a_batch_has_in_flight(upstream, socket_dir):
    proxy = InferenceProxy(max_in_flight=2)
    upstream.delay_s = 1.0
    path = socket_dir / "busy.sock"
    try:
        proxy.open(path, {"m": Upstream(upstream.base_url)})

        def one(_):
            with http(path) as client:
                return client.post("/chat/completions", json=chat("m"))

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(4) as pool:
            responses = list(pool.map(one, range(4)))
        with http(path) as client:  # the cap is on what is in flight: once they are done, more pass
            upstream.delay_s = 0.0
            assert client.post("/chat/completions", json=chat("m")).status_code == 200
    finally:
        proxy.shutdown()
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200, 200, 429, 429]
    refused = next(r for r in responses if r.status_code == 429).json()["error"]
    assert refused["code"] == "too_many_requests_in_flight" and "max_in_flight=2" in refused["message"]
    assert len(upstream.requests) == 3


def test_a_body_nested_too_deep_is_a_400_naming_the_limit(upstream, socket_dir):
    """100,000 levels made the proxy's JSON parser raise RecursionError, answered as a 500."""
    deep = b'{"model": "run-1@3", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    proxy = InferenceProxy()  # the default body limit (8 MB), far above these 200 kB
    served = socket_dir / "deep.sock"
    proxy.open(served, {"run-1@3": Upstream(upstream.base_url)})
    with http(served) as client:
        response = client.post("/chat/completions", content=deep, headers={"Content-Type": "application/json"})
        within = {"type": "object", "properties": {}}
        node = within
        for _ in range(25):  # a deep but reasonable tool schema (56 levels in all) still passes
            node["properties"]["x"] = {"type": "object", "properties": {}}
            node = node["properties"]["x"]
        tool = {"type": "function", "function": {"name": "f", "parameters": within}}
        fine = client.post("/chat/completions", json=chat(tools=[tool]))
    assert response.status_code == 400
    error = response.json()["error"]
    proxy.shutdown()
    assert error["code"] == "json_too_deep" and "nesting depth limit is 64" in error["message"]
    assert fine.status_code == 200 and len(upstream.requests) == 1
