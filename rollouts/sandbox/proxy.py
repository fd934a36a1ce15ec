"""The inference proxy: the only door from a jailed rollout to the model servers.

User code runs with no network but one unix socket, served here. Through it a script reaches the
OpenAI inference routes of the models its batch may use, and nothing else: not vLLM's admin routes
(adapter loading, weight reloads, sleep), not another run's policy, not the server's API key. The
proxy adds the upstream's key itself, so the key never enters the jail.

One background thread owns an asyncio loop; every socket (one per batch) is an aiohttp application
of its own that knows its allowed models, and all of them share one client session to the worker's own
upstreams. An upstream a user named (a judge endpoint) is reached through the egress guard
(rollouts.sandbox.egress) instead, and no upstream's redirect is followed.

What passes is bounded: the OpenAI request fields listed in FORWARDED_FIELDS (rollouts.sandbox.proxy_rules;
an inference server's own extensions, such as vLLM's priority or kv_transfer_params, are refused), `n`,
the token budget and the top log-probabilities of a request, the requests a batch has in flight, and a
body's size and JSON nesting depth.

Every chat completion bound for the worker's own servers asks for its sampled token ids and their
log-probabilities (SAMPLED_TOKENS), whichever client the script built, and the reply comes back with them:
the trainer needs them from each choice. The proxy keeps nothing of it; what a trajectory records is the
choice the script got.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from rollouts.sandbox.egress import EgressPolicy, EgressRefused, egress_connector, redirect_error, target_key
from rollouts.sandbox.jsonsafe import JSONLimitError, loads_bounded
from rollouts.sandbox.proxy_rules import (
    FORWARDED_ROUTES,
    PASSED_ROUTES,
    REFUSED,
    asking_sampled_tokens,
    check_fields,
    model_card,
    model_not_found,
    openai_error,
)
from rollouts.sandbox.tunnel import HOP_BY_HOP, connect_serve, split_target

# Set again by this side's own server for the body it actually sends.
RESPONSE_DROPPED = HOP_BY_HOP | {"content-length", "content-encoding", "date", "server"}

# Bodies up to this size are parsed on the loop (microseconds); larger ones on a thread.
INLINE_PARSE_BYTES = 64 << 10

# Stats of closed sockets stay readable for logs; this many are kept.
CLOSED_STATS_KEPT = 256


@dataclass(frozen=True)
class Upstream:
    base_url: str  # an OpenAI-compatible server's ".../v1" URL
    # Sent upstream as "Authorization: Bearer"; the caller's own header is never forwarded.
    api_key: str | None = None
    # A server a user named (a judge endpoint): every connection to it goes through the egress guard under
    # this policy. None: a server the worker started itself (its vLLM, on its own loopback).
    egress: EgressPolicy | None = None


@dataclass
class _Socket:
    path: str
    models: dict[str, Upstream]
    runner: web.AppRunner | None = None
    site: web.UnixSite | None = None
    tasks: set[asyncio.Task] = field(default_factory=set)  # handlers in flight, cancelled by close()
    stats: dict[str, int] = field(default_factory=lambda: {"requests": 0, "refused": 0})
    in_flight: int = 0  # requests read, checked and passed upstream, not yet answered


class InferenceProxy:
    def __init__(
        self,
        *,
        max_body_bytes: int = 8 << 20,
        timeout_s: float = 600.0,
        max_json_depth: int = 64,
        max_n: int = 16,
        max_tokens: int = 32_768,
        max_in_flight: int = 1024,
    ) -> None:
        """max_body_bytes: the largest request body accepted. timeout_s: the longest one upstream
        request may take, a streamed response included. max_json_depth: nesting levels of a request body
        (an OpenAI request needs a few; a tool's JSON schema a few more). max_n: choices one request may
        ask for. max_tokens: the largest max_tokens / max_completion_tokens (a run's own limit is at most
        this). max_in_flight: requests one socket (one batch) may have upstream at once; a run's
        concurrency is at most this."""
        self.max_body_bytes = max_body_bytes
        self.timeout_s = timeout_s
        self.max_json_depth = max_json_depth
        self.max_in_flight = max_in_flight
        self._caps = {"n": max_n, "best_of": max_n, "max_tokens": max_tokens, "max_completion_tokens": max_tokens}
        self._sockets: dict[str, _Socket] = {}
        self._closed_stats: collections.OrderedDict[str, dict[str, int]] = collections.OrderedDict()
        self._lock = threading.Lock()  # guards starting and stopping the thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # One client session for the worker's own upstreams, and one per egress policy for users' servers.
        self._sessions: dict[EgressPolicy | None, aiohttp.ClientSession] = {}
        self._egress: dict[str, tuple[asyncio.AbstractServer, set[asyncio.Task]]] = {}

    # --- the caller's side: any thread --------------------------------------------------------------

    def open(self, socket_path: str | os.PathLike, models: Mapping[str, Upstream]) -> None:
        """Serve on a new unix socket at socket_path (mode 0o666: the directory holding it decides who
        reaches it) until close(socket_path). Blocks until the socket is listening."""
        self._call(self._open(_key(socket_path), dict(models)))

    def open_egress(
        self,
        socket_path: str | os.PathLike,
        hosts: Iterable[str],
        policy: EgressPolicy | None = None,
        record: Callable[[dict], None] | None = None,
    ) -> None:
        """Serve HTTPS tunnels (HTTP CONNECT) on a new unix socket, to the given "host:port" only and only
        where the egress guard accepts them under `policy` (None: public addresses on ports 443 and 80),
        until close(socket_path). For the tracing service a run configured itself (Weave) and the named
        hosts its config lists: TLS stays end to end between the user's code and that service; nothing
        else is reachable through it. `record` is called, on the proxy's thread, with each connection made
        or refused (rollouts.sandbox.tunnel.connect_serve says what it holds)."""
        allowed = frozenset(target_key(*split_target(h)) for h in hosts)
        self._call(self._open_egress(_key(socket_path), allowed, policy or EgressPolicy(), record))

    def close(self, socket_path: str | os.PathLike) -> None:
        """Stop listening, abort that socket's in-flight requests, remove the file; idempotent."""
        with self._lock:
            if self._loop is None:
                return
        key = _key(socket_path)
        self._call(self._close_egress(key) if key in self._egress else self._close(key))

    def shutdown(self) -> None:
        """Close every socket and stop the thread; the proxy can be opened again afterwards."""
        with self._lock:
            loop, thread = self._loop, self._thread
            if loop is None or thread is None:
                return
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result()
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
            self._loop = self._thread = None

    def stats(self, socket_path: str | os.PathLike) -> dict:
        """{"requests": n, "refused": n} for that socket, open or recently closed."""
        key = _key(socket_path)
        sock = self._sockets.get(key)
        if sock is not None:
            return dict(sock.stats)
        return dict(self._closed_stats.get(key, {"requests": 0, "refused": 0}))

    def _call(self, coro):
        loop = self._ensure_loop()
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("InferenceProxy.open/close are blocking calls; do not call them from its own loop")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()
                self._thread = threading.Thread(
                    target=self._run, args=(loop, ready), name="inference-proxy", daemon=True
                )
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def _run(self, loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()

    # --- the loop's side ----------------------------------------------------------------------------

    async def _open(self, key: str, models: dict[str, Upstream]) -> None:
        if key in self._sockets:
            raise RuntimeError(f"The proxy already serves {key}; close it first.")
        sock = _Socket(path=key, models=models)
        app = web.Application(client_max_size=self.max_body_bytes)

        async def handle(request: web.Request) -> web.StreamResponse:
            return await self._handle(sock, request)

        app.router.add_route("*", "/{tail:.*}", handle)
        # handler_cancellation: a client that hangs up cancels its handler, and with it the upstream
        # request, so vLLM stops generating for nobody.
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.UnixSite(runner, key)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        os.chmod(key, 0o666)
        sock.runner, sock.site = runner, site
        self._sockets[key] = sock
        self._closed_stats.pop(key, None)

    async def _close(self, key: str) -> None:
        sock = self._sockets.pop(key, None)
        if sock is None:
            return
        if sock.site is not None:
            await sock.site.stop()
        for task in list(sock.tasks):
            task.cancel()
        if sock.tasks:
            await asyncio.wait(list(sock.tasks), timeout=5)
        if sock.runner is not None:
            await sock.runner.cleanup()
        try:
            os.unlink(key)
        except FileNotFoundError:
            pass
        self._closed_stats[key] = dict(sock.stats)
        while len(self._closed_stats) > CLOSED_STATS_KEPT:
            self._closed_stats.popitem(last=False)

    def _session(self, upstream: Upstream) -> aiohttp.ClientSession:
        session = self._sessions.get(upstream.egress)
        if session is None:
            # No cap on connections: a batch keeps hundreds of streams open to one server at once.
            connector = (
                aiohttp.TCPConnector(limit=0, limit_per_host=0)
                if upstream.egress is None
                else egress_connector(upstream.egress, limit=0, limit_per_host=0)
            )
            session = self._sessions[upstream.egress] = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                trust_env=False,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=10),
            )
        return session

    async def _open_egress(
        self, key: str, allowed: frozenset[str], policy: EgressPolicy, record: Callable[[dict], None] | None
    ) -> None:
        if key in self._egress or key in self._sockets:
            raise RuntimeError(f"The proxy already serves {key}; close it first.")
        tasks: set[asyncio.Task] = set()

        async def tunnel(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            tasks.add(task)
            try:
                await connect_serve(reader, writer, policy=policy, allowed=allowed, record=record)
            finally:
                tasks.discard(task)

        server = await asyncio.start_unix_server(tunnel, key, limit=1 << 16)
        os.chmod(key, 0o666)
        self._egress[key] = (server, tasks)

    async def _close_egress(self, key: str) -> None:
        server, tasks = self._egress.pop(key)
        server.close()
        for task in list(tasks):
            task.cancel()
        if tasks:
            await asyncio.wait(list(tasks), timeout=5)
        try:
            os.unlink(key)
        except FileNotFoundError:
            pass

    async def _shutdown(self) -> None:
        for key in list(self._egress):
            await self._close_egress(key)
        for key in list(self._sockets):
            await self._close(key)
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()

    async def _handle(self, sock: _Socket, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        sock.tasks.add(task)
        sock.stats["requests"] += 1
        try:
            response = await self._route(sock, request)
        finally:
            sock.tasks.discard(task)
        if response.get(REFUSED):
            sock.stats["refused"] += 1
        return response

    async def _route(self, sock: _Socket, request: web.Request) -> web.StreamResponse:
        method, path = request.method, request.path
        if method == "GET" and path == "/v1/models":
            return web.json_response({"object": "list", "data": [model_card(name) for name in sock.models]})
        if method == "GET" and path.startswith("/v1/models/") and path.count("/") == 3:
            name = path.removeprefix("/v1/models/")
            if name in sock.models:
                return web.json_response(model_card(name))
            return model_not_found(name, sock.models)
        suffix = FORWARDED_ROUTES.get((method, path))
        if suffix is None:
            return openai_error(
                404,
                f"{method} {path} is not available here: the inference proxy passes only {PASSED_ROUTES}.",
                "route_not_found",
            )

        body = await self._read_body(request)
        if isinstance(body, web.Response):
            return body
        model = body.get("model")
        if not isinstance(model, str) or model not in sock.models:
            return model_not_found(model, sock.models)
        refused = check_fields(body, suffix, self._caps)
        if refused is not None:
            return refused
        if sock.in_flight >= self.max_in_flight:
            return openai_error(
                429,
                f"This batch already has {sock.in_flight} requests in flight, the proxy's limit "
                f"(max_in_flight={self.max_in_flight}); wait for some to finish, or lower the run's concurrency.",
                "too_many_requests_in_flight",
                "rate_limit_error",
            )
        upstream = sock.models[model]
        if upstream.egress is None:
            # A server a user named (a judge endpoint) may not know return_token_ids, and is never trained
            # on: its requests go as sent.
            body = asking_sampled_tokens(body, suffix)
        sock.in_flight += 1
        try:
            return await self._forward(request, upstream, suffix, model, body)
        finally:
            sock.in_flight -= 1

    async def _read_body(self, request: web.Request) -> dict | web.Response:
        too_large = openai_error(
            413,
            f"The request body is larger than the proxy's limit of {self.max_body_bytes} bytes.",
            "request_too_large",
        )
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            return too_large
        raw = bytearray()
        while chunk := await request.content.read(64 << 10):
            raw += chunk
            if len(raw) > self.max_body_bytes:
                return too_large
        try:
            if len(raw) <= INLINE_PARSE_BYTES:
                body = loads_bounded(raw, max_depth=self.max_json_depth)
            else:
                # Off the loop: checking a large body's nesting takes CPU time (seconds for 8 MB of
                # brackets) that every other batch's streams would otherwise wait through.
                body = await asyncio.to_thread(loads_bounded, bytes(raw), max_depth=self.max_json_depth)
        except JSONLimitError as exc:
            return openai_error(400, f"The request body is refused: {exc}", "json_too_deep")
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError included
            return openai_error(400, f"The request body is not valid JSON: {exc}.", "invalid_json")
        if not isinstance(body, dict):
            return openai_error(400, "The request body must be a JSON object.", "invalid_json")
        return body

    async def _forward(
        self, request: web.Request, upstream: Upstream, suffix: str, model: str, body: dict
    ) -> web.StreamResponse:
        headers = {
            "Content-Type": "application/json",
            "Accept": request.headers.get("Accept", "*/*"),
            # Bytes pass through unchanged, so they must arrive unencoded.
            "Accept-Encoding": "identity",
        }
        if upstream.api_key:
            headers["Authorization"] = f"Bearer {upstream.api_key}"
        # The body goes upstream as the proxy parsed it, not as sent: two parsers reading one document two
        # ways (a duplicated "model" key) must not route a request to a model this socket does not allow.
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        reply = await self._post(upstream, upstream.base_url.rstrip("/") + suffix, data, headers, model)
        if isinstance(reply, web.Response):
            return reply
        if 300 <= reply.status < 400:
            reply.close()  # its body is the redirecting server's word, not the model's: never passed on
            error = redirect_error(
                f"The server for model `{model}`", reply.status, reply.reason or "", reply.headers.get("Location")
            )
            return openai_error(502, str(error), "upstream_redirect", "server_error")
        return await _relay(request, reply)

    async def _post(
        self, upstream: Upstream, url: str, data: bytes, headers: dict[str, str], model: str
    ) -> aiohttp.ClientResponse | web.Response:
        """The upstream's reply (its body still to read), or the error the caller gets when there is none."""
        try:
            return await self._session(upstream).post(url, data=data, headers=headers, allow_redirects=False)
        except EgressRefused as exc:
            return openai_error(
                502,
                f"The server for model `{model}` is not reachable from here: {exc}",
                "upstream_refused",
                "server_error",
            )
        except TimeoutError:  # before ClientError: aiohttp's timeouts are both
            return openai_error(
                504,
                f"The inference server for model `{model}` did not answer within {self.timeout_s:g} s.",
                "upstream_timeout",
                "server_error",
            )
        except aiohttp.ClientConnectorError as exc:
            # The errno's own words: the OS message would name the server's address.
            errno = exc.os_error.errno
            reason = os.strerror(errno) if errno else type(exc.os_error).__name__
            return openai_error(
                502,
                f"The inference server for model `{model}` cannot be reached ({reason}); it may "
                f"be restarting, retry shortly.",
                "upstream_unreachable",
                "server_error",
            )
        except aiohttp.ClientError as exc:
            return openai_error(
                502,
                f"The inference server for model `{model}` failed to answer ({type(exc).__name__}).",
                "upstream_error",
                "server_error",
            )


async def _relay(request: web.Request, reply: aiohttp.ClientResponse) -> web.StreamResponse:
    """The upstream's reply passed on to the caller as it arrives."""
    finished = False
    try:
        response = web.StreamResponse(status=reply.status, reason=reply.reason)
        for name, value in reply.headers.items():
            if name.lower() not in RESPONSE_DROPPED:
                response.headers.add(name, value)
        await response.prepare(request)
        try:
            # iter_any hands over each chunk as it arrives, so a streamed (SSE) reply stays a stream.
            async for chunk in reply.content.iter_any():
                await response.write(chunk)
        except ConnectionResetError:  # the caller hung up: nobody is left to tell
            return response
        except (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
            # Too late for an error status: cutting the connection before the last chunk is how
            # HTTP tells the client its reply is incomplete.
            if request.transport is not None:
                request.transport.close()
            return response
        finished = True
        await response.write_eof()
        return response
    finally:
        # A caller that hung up, or close(), leaves the upstream reply unread: drop that connection
        # rather than return it to the pool with a half-read body.
        if finished:
            reply.release()
        else:
            reply.close()


def _key(socket_path: str | os.PathLike) -> str:
    return os.path.abspath(os.fspath(socket_path))
