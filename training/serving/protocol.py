"""How a request to the OpenAI-compatible endpoint reaches a GPU worker and how its answer comes back: both
sides of the hand-over, written once. No Django here: the web side (Exchange) runs in the ASGI server and,
through training.serving.services.serving, in the background jobs; the worker's side (ReplyWriter) in the
serving thread (training.serving.worker).

- The web side puts the request, JSON {"id", "base_model", "adapter", "body", "at"}, on the Redis list of
  its base model (QUEUE_KEY), then blocks on the request's reply list (REPLY_KEY).
- A worker's serving thread pops it and pushes entries on the reply list, each one byte of kind and then
  its data, in this order:
    b"c"                  claimed: a worker took the request (before it waits for the worker's gate)
    b"s"                  started: vLLM answered 200 and its answer follows; or instead of it
    b"x" + JSON           an error, {"status", "message", "code"}, then b"e"
    b"b" + JSON           the whole answer, for a request without `stream`; or
    b"d" + JSON           one streamed chunk as vLLM sent it after "data: ", per chunk (the last is b"[DONE]")
    b"e"                  the end
- The web side that gives up sets the request's CANCEL_KEY: a worker that has not started it skips it, one
  that streams stops. A request no worker claimed before the deadline is taken back off the queue (503);
  one that was claimed and not answered is cancelled (504).

Redis lists make the hand-over a blocking pop on both sides: no polling, well under a millisecond per chunk.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

QUEUE_KEY = "artweb:serve:q:{base_model_id}"
REPLY_KEY = "artweb:serve:r:{request_id}"
CANCEL_KEY = "artweb:serve:cancel:{request_id}"
ALIVE_KEY = "artweb:serve:alive"  # set (with a TTL) while at least one worker's serving thread runs
REPLY_TTL_S = 900
ALIVE_TTL_S = 30
POP_S = 10  # the longest blocking pop: under the connections' socket timeout (30 s)

CLAIMED, STARTED, ERROR, BODY, CHUNK, END = b"c", b"s", b"x", b"b", b"d", b"e"


class ServeError(Exception):
    """An answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retry_after: int | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after = retry_after  # seconds, sent as Retry-After (a 429)

    def as_dict(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ServeTarget:
    """What a model name means: a base model, and the adapter of a checkpoint on it (or none)."""

    requested: str  # the name the caller used; answers carry it as their "model"
    base_model_id: int
    adapter_name: str | None = None  # the name the worker serves the adapter as (run-<id>@<step>)
    adapter_path: str | None = None
    checkpoint_id: int | None = None

    def as_request(self) -> dict:
        return {
            "base_model": self.base_model_id,
            "adapter": {"name": self.adapter_name, "path": self.adapter_path} if self.adapter_name else None,
        }


def worker_error(data: bytes) -> ServeError:
    """The ServeError an error entry's data (b"x" + JSON) carries."""
    error = json.loads(data)
    return ServeError(error["status"], error["message"], code=error.get("code"))


def renamed(answer: bytes, name: str) -> bytes:
    """An answer or a chunk (JSON) with "model" set to the name the caller used."""
    try:
        data = json.loads(answer)
    except ValueError:
        return answer
    if isinstance(data, dict) and "model" in data:
        data["model"] = name
    return json.dumps(data, separators=(",", ":")).encode()


class Exchange:
    """The web side of one request, on an asyncio Redis client: `start`, then `answer` (a request without
    `stream`) or `events` (a streamed one)."""

    def __init__(self, conn, target: ServeTarget, body: dict, *, timeout_s: float):
        self.conn = conn
        self.requested = target.requested
        self.timeout_s = timeout_s
        request_id = uuid.uuid4().hex
        self.payload = json.dumps({"id": request_id, **target.as_request(), "body": body, "at": time.time()}).encode()
        self.queue_key = QUEUE_KEY.format(base_model_id=target.base_model_id)
        self.reply_key = REPLY_KEY.format(request_id=request_id)
        self.cancel_key = CANCEL_KEY.format(request_id=request_id)
        self.deadline = 0.0
        self.claimed = False

    async def start(self) -> None:
        """Queue the request and wait until vLLM answers it. ServeError: no worker serves (503), none took the
        request before the deadline (503, taken off the queue), the worker's error, no answer in time (504)."""
        if not await self.conn.exists(ALIVE_KEY):
            raise ServeError(
                503,
                "No GPU worker is serving models right now; start one (make run starts it) and try again.",
                code="no_worker",
            )
        await self.conn.rpush(self.queue_key, self.payload)
        self.deadline = time.monotonic() + self.timeout_s
        while (entry := await self._next()) is not None:
            kind, data = entry
            if kind == CLAIMED:
                self.claimed = True
            elif kind == ERROR:
                raise worker_error(data)
            elif kind == STARTED:
                return
        if not self.claimed and await self.conn.lrem(self.queue_key, 1, self.payload):
            raise ServeError(503, f"No worker took the request within {self.timeout_s:g} s; try again.")
        await self.cancel()
        raise ServeError(504, "The worker did not answer in time.")

    async def answer(self) -> bytes:
        """The whole answer (JSON, renamed) after `start`; ServeError when the worker failed or fell silent."""
        entry = await self._next()
        if entry is not None and entry[0] == BODY:
            return renamed(entry[1], self.requested)
        if entry is not None and entry[0] == ERROR:
            raise worker_error(entry[1])
        await self.cancel()
        raise ServeError(502, "The worker's answer was cut off.")

    async def events(self) -> AsyncIterator[bytes]:
        """The streamed answer after `start`, as server-sent events: each chunk renamed, an error as an error
        event. When the caller goes away or the worker falls silent, the worker is told to stop."""
        finished = False
        try:
            while (entry := await self._next()) is not None:
                kind, data = entry
                if kind == CHUNK:
                    yield (
                        b"data: "
                        + (b"[DONE]" if data.strip() == b"[DONE]" else renamed(data, self.requested))
                        + b"\n\n"
                    )
                elif kind == ERROR:
                    yield b"data: " + json.dumps(worker_error(data).as_dict()).encode() + b"\n\n"
                elif kind == END:
                    finished = True
                    break
        finally:
            if not finished:
                await self.cancel()

    async def cancel(self) -> None:
        await self.conn.set(self.cancel_key, 1, ex=REPLY_TTL_S)

    async def _next(self) -> tuple[bytes, bytes] | None:
        """The next entry as (kind, data); None once the deadline passed. Short blocking pops until then."""
        while (left := self.deadline - time.monotonic()) > 0:
            item = await self.conn.blpop([self.reply_key], timeout=max(0.05, min(left, POP_S)))
            if item is not None:
                return item[1][:1], item[1][1:]
        return None


class ReplyWriter:
    """The worker's side of one request: its entries, on a (synchronous) Redis client."""

    def __init__(self, conn, request_id: str):
        self.conn = conn
        self.key = REPLY_KEY.format(request_id=request_id)
        self.cancel_key = CANCEL_KEY.format(request_id=request_id)

    def claim(self) -> None:
        self.conn.pipeline(transaction=False).rpush(self.key, CLAIMED).expire(self.key, REPLY_TTL_S).execute()

    def cancelled(self) -> bool:
        """The web side gave up on the request."""
        return bool(self.conn.exists(self.cancel_key))

    def start(self) -> None:
        self.conn.rpush(self.key, STARTED)

    def body(self, answer: bytes) -> None:
        self.conn.rpush(self.key, BODY + answer)

    def chunk(self, data: bytes) -> None:
        self.conn.rpush(self.key, CHUNK + data)

    def fail(self, status: int, message: str, code: str | None = None) -> None:
        self.conn.rpush(self.key, ERROR + json.dumps({"status": status, "message": message, "code": code}).encode())
        self.end()

    def end(self) -> None:
        self.conn.rpush(self.key, END)
