"""Proxies that reach out through the egress guard (rollouts.sandbox.egress), for clients that open their
own connections.

- connect_serve: one HTTPS tunnel (HTTP CONNECT) of the jail's egress socket (InferenceProxy.open_egress):
  the target must be one of the run's own hosts (its tracing service's, and the named hosts its config
  lists), and the guard must accept it. Each connection, made or refused, is reported to a `record`
  callback: host, port, bytes each way, seconds, and why it was refused.
- LocalEgressProxy: a forward proxy on 127.0.0.1 behind a random credential, handed as their HTTP(S) proxy
  to clients artweb cannot give a connection of its own (wandb's service process, weave in a test
  process). CONNECT for https, absolute-form requests for http; every connection checked, no redirect
  followed (a 3xx becomes a 502 naming it), and of a plain-http answer that is not JSON only the status
  line and headers pass.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import h11
import httpx

from rollouts.sandbox.egress import (
    EgressPolicy,
    EgressRedirect,
    EgressRefused,
    egress_async_client,
    egress_open_connection,
    failure_reason,
    target_key,
)
from rollouts.sandbox.jsonsafe import loads_bounded

HEAD_LIMIT = 1 << 16  # bytes of a request line and headers
ANSWER_LIMIT = 16 << 20  # bytes of a plain-http answer passed on; what is larger is withheld
ANSWER_DEPTH = 256  # nesting levels of a JSON answer passed on
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 30.0
# RFC 9110 section 7.6.1: these describe one connection, not the message, and never cross a proxy.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-connection",
        "expect",
    }
)


# A connection as `record` first sees it: nothing moved yet, nothing allowed.
NO_CONNECTION = {"host": "", "port": 0, "allowed": False, "sent": 0, "received": 0, "seconds": 0.0}


def split_target(target: str) -> tuple[str, int]:
    """("host", port) of a CONNECT target "host:port" or "[v6]:port"; ValueError otherwise."""
    host, sep, port = target.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{target!r} is not host:port")
    return host, int(port)


async def _answer(writer: asyncio.StreamWriter, status: int, reason: str, message: str = "", extra: str = "") -> None:
    body = message.encode()
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        f"Connection: close\r\n{extra}\r\n".encode()
        + body
    )
    try:
        await writer.drain()
    except OSError:
        pass
    writer.close()


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, moved: list[int] | None = None) -> None:
    """Copy src to dst until either side closes; moved[0] counts the bytes copied."""
    try:
        while data := await src.read(1 << 16):
            dst.write(data)
            await dst.drain()
            if moved is not None:
                moved[0] += len(data)
    except OSError:
        pass
    finally:
        dst.close()


async def _tunnel(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    target: str,
    policy: EgressPolicy,
    allowed: frozenset[str] | None,
    problems: list[str] | None = None,
    early: bytes = b"",
    record: Callable[[dict], None] | None = None,
) -> None:
    """Check target, connect through the guard, answer 200 and pipe both ways; 4xx/5xx otherwise. With
    `record`, the connection is reported once it ends, whichever way it ends (see connect_serve)."""
    started = time.monotonic()
    entry = {**NO_CONNECTION, "host": target[:300]}
    sent, received = [0], [0]
    try:
        try:
            host, port = split_target(target)
        except ValueError as exc:
            entry["reason"] = f"CONNECT needs host:port: {exc}."
            await _answer(writer, 400, "Bad Request", entry["reason"])
            return
        entry.update(host=host, port=port)
        if allowed is not None and target_key(host, port) not in allowed:
            entry["reason"] = f"{target_key(host, port)} is not one of this run's hosts."
            await _answer(writer, 403, "Forbidden", entry["reason"])
            return
        try:
            up_reader, up_writer = await egress_open_connection(host, port, policy, timeout=CONNECT_TIMEOUT_S)
        except EgressRefused as exc:
            entry["reason"] = str(exc)
            await _answer(writer, 403, "Forbidden", _noted(problems, str(exc)))
            return
        except (OSError, TimeoutError) as exc:
            why = "no answer in time" if isinstance(exc, TimeoutError) else failure_reason(exc)
            entry["reason"] = f"{target_key(host, port)} cannot be reached ({why})."
            await _answer(writer, 502, "Bad Gateway", _noted(problems, entry["reason"]))
            return
        entry["allowed"] = True
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        if early:
            up_writer.write(early)
            sent[0] += len(early)
        await writer.drain()
        await asyncio.gather(_pump(reader, up_writer, sent), _pump(up_reader, writer, received))
    finally:
        # Also when the batch ends with the tunnel still open (its task cancelled): every connection is told.
        if record is not None:
            entry.update(sent=sent[0], received=received[0], seconds=round(time.monotonic() - started, 3))
            record(entry)


async def connect_serve(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    policy: EgressPolicy,
    allowed: frozenset[str],
    record: Callable[[dict], None] | None = None,
) -> None:
    """One CONNECT request of the jail's egress socket: to one of `allowed` ("host:port" as target_key
    writes them), through the guard; anything else gets a 4xx saying why. `record` gets the connection as
    a dict: host, port, allowed, sent and received (bytes, from the jail's side), seconds, and reason
    (why it was refused or could not be made; absent for one that was made)."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=HEAD_TIMEOUT_S)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
        writer.close()
        return
    parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
    if len(parts) != 3 or parts[0] != "CONNECT":
        await _answer(writer, 405, "Method Not Allowed", "Only CONNECT is served here.")
        if record is not None:
            record({**NO_CONNECTION, "reason": "not a CONNECT request (the tunnel serves https:// URLs only)"})
        return
    await _tunnel(reader, writer, parts[1], policy, allowed, record=record)


class LocalEgressProxy:
    """A forward proxy on 127.0.0.1 whose every connection goes through the guard; a context manager.

    with LocalEgressProxy(policy) as proxy: hand proxy.url (credential included) to the client as its
    HTTP and HTTPS proxy. A request without the credential gets 407: other local users cannot borrow it.
    proxy.problems lists what the guard refused and what could not be reached, in words fit for a person,
    for an error message the client would not give (it quotes this proxy's answers as bodies, if at all)."""

    def __init__(self, policy: EgressPolicy, *, timeout_s: float = 60.0) -> None:
        self.policy = policy
        self.timeout_s = timeout_s
        self.problems: list[str] = []
        self._secret = secrets.token_urlsafe(24)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://artweb:{self._secret}@127.0.0.1:{self.port}"

    def __enter__(self) -> LocalEgressProxy:
        loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="egress-proxy", daemon=True)
        self._thread.start()
        self._loop = loop
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0, limit=HEAD_LIMIT), loop
        ).result()
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc_info) -> None:
        assert self._loop is not None and self._thread is not None
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            await self._one_request(reader, writer)
        except h11.RemoteProtocolError as exc:
            await _answer(writer, 400, "Bad Request", f"Not a request this proxy serves: {exc}.")
        except (OSError, h11.ProtocolError, asyncio.IncompleteReadError, TimeoutError, asyncio.CancelledError):
            # Cancelled by __exit__, or the client or the server gave up: nobody is waiting for an answer.
            writer.close()
        finally:
            self._tasks.discard(task)

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_LIMIT)
        event = await _next_event(conn, reader)
        if not isinstance(event, h11.Request):
            writer.close()
            return
        # As sent (h11 keeps the original case): some servers read header names case-sensitively.
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers.raw_items()]
        if not self._authorized({k.lower(): v for k, v in headers}.get("proxy-authorization", "")):
            await _answer(
                writer, 407, "Proxy Authentication Required", "", 'Proxy-Authenticate: Basic realm="artweb"\r\n'
            )
            return
        target = event.target.decode("latin-1")
        if event.method == b"CONNECT":
            early, _ = conn.trailing_data
            await _tunnel(reader, writer, target, self.policy, None, self.problems, early)
            return
        await self._forward(conn, event, headers, target, reader, writer)

    def _authorized(self, value: str) -> bool:
        scheme, _, encoded = value.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            _, _, secret = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except ValueError:
            return False
        return hmac.compare_digest(secret.encode(), self._secret.encode())

    async def _forward(self, conn, request, headers, target, reader, writer) -> None:
        """A plain-http request in absolute form, sent through an egress client; its answer (read whole, as
        the services these clients use answer in JSON of modest size) passed back on one connection."""
        url = urlsplit(target)
        if url.scheme != "http" or not url.hostname:
            await _answer(writer, 400, "Bad Request", "Give an absolute http:// URL, or CONNECT for https.")
            return
        if conn.they_are_waiting_for_100_continue:
            await _send(writer, conn, h11.InformationalResponse(status_code=100, headers=[]))
        forwarded = [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP and k.lower() != "host"]

        async def body():
            while True:
                event = await _next_event(conn, reader)
                if isinstance(event, h11.Data):
                    yield bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    return
                else:
                    raise OSError("the client closed the connection mid-request")

        async with egress_async_client(self.policy, timeout=self.timeout_s) as client:
            try:
                async with client.stream(request.method.decode(), target, headers=forwarded, content=body()) as reply:
                    # The services these clients speak to answer in JSON. A plain-http answer that is not JSON
                    # (or over ANSWER_LIMIT) is something else's: a page or a banner of whatever listens
                    # there. Its status line and headers pass, its body does not, so no client can quote it
                    # back to a person in an error message.
                    data = bytearray()
                    async for chunk in reply.aiter_bytes():
                        data += chunk
                        if len(data) > ANSWER_LIMIT:
                            break
                    if not _is_json(data):
                        data = bytearray()
                    dropped = HOP_BY_HOP | {"content-length", "content-encoding"}
                    kept = [(k, v) for k, v in reply.headers.multi_items() if k.lower() not in dropped]
                    headers = [*kept, ("content-length", str(len(data))), ("connection", "close")]
                    await _send(writer, conn, h11.Response(status_code=reply.status_code, headers=headers))
                    if data:
                        await _send(writer, conn, h11.Data(data=bytes(data)))
                    await _send(writer, conn, h11.EndOfMessage())
            except EgressRedirect as exc:
                await _answer(writer, 502, "Bad Gateway", _noted(self.problems, str(exc)))
                return
            except EgressRefused as exc:
                await _answer(writer, 403, "Forbidden", _noted(self.problems, str(exc)))
                return
            except httpx.HTTPError as exc:
                if conn.our_state is h11.SEND_RESPONSE:
                    where = target_key(url.hostname, url.port or 80)
                    why = f"{where} cannot be reached ({failure_reason(exc)})."
                    await _answer(writer, 502, "Bad Gateway", _noted(self.problems, why))
                    return
        writer.close()


def _noted(problems: list[str] | None, message: str) -> str:
    if problems is not None and message not in problems:
        problems.append(message)
    return message


def _is_json(data: bytes | bytearray) -> bool:
    if not data:
        return True  # nothing to quote
    if len(data) > ANSWER_LIMIT:
        return False
    try:
        loads_bounded(data, max_depth=ANSWER_DEPTH)
    except ValueError:
        return False
    return True


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader):
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await asyncio.wait_for(reader.read(1 << 16), HEAD_TIMEOUT_S))


async def _send(writer: asyncio.StreamWriter, conn: h11.Connection, event) -> None:
    data = conn.send(event)
    if data:
        writer.write(data)
        await writer.drain()
