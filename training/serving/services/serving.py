"""Serving trained checkpoints, the web side: the checks on a chat completion request, and its trip to a
GPU worker's serving thread and back (training.serving.protocol) for the endpoint and the background jobs.

The design (see docs/guides/serve-a-checkpoint.md, "How a request is served"):

- The web process resolves `model` (a base model, `<run>@<step|best|latest>`, or an alias) for the
  token's user (training.serving.selectors), then puts the request on a Redis list of that base model.
- Each GPU worker runs one serving thread (training.serving.worker, started with the worker's pool
  process by artweb.celery). It takes requests from the list of the base model its inference server holds,
  answers each on a server that a running step leaves alone (training.services.serving_server: the step's
  own beside its rollouts, or a second one; between steps only where neither can be), loads the adapter
  and calls the server directly with its key: not through any batch's proxy or jail.
- vLLM's answer comes back on a Redis list of the request, one entry per streamed chunk, which the web
  process relays as it arrives.
"""

from __future__ import annotations

import asyncio
import json
import threading
import weakref

import redis.asyncio as aioredis
from django.conf import settings

from training.serving.protocol import Exchange, ServeError, ServeTarget

MAX_SAMPLES = 16  # n per request: a request holds the worker's gate while it runs

_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> its Redis client
_local = threading.local()


def serve_body_check(body) -> dict:
    """The chat completion request as vLLM will get it; ServeError 400 saying what to fix."""
    if not isinstance(body, dict):
        raise ServeError(400, "The request body must be a JSON object (OpenAI's chat completion request).")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ServeError(400, "'messages' must be a non-empty list of chat messages.", param="messages")
    n = body.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_SAMPLES:
        raise ServeError(400, f"'n' must be a whole number from 1 to {MAX_SAMPLES}.", param="n")
    return dict(body)


def serve_timeout_s() -> float:
    """How long a request may wait for a worker and its answer."""
    return float(settings.ARTWEB["SERVE_TIMEOUT_SECONDS"])


def serve_redis() -> aioredis.Redis:
    """One client per event loop (a pool's connections belong to the loop that opened them)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = aioredis.Redis.from_url(settings.REDIS_URL, socket_timeout=30)
    return client


async def serve_exchange_start(*, target: ServeTarget, body: dict, timeout_s: float | None = None) -> Exchange:
    """Send a checked request to a serving worker and wait until vLLM answers (ServeError otherwise)."""
    exchange = Exchange(serve_redis(), target, body, timeout_s=timeout_s or serve_timeout_s())
    await exchange.start()
    return exchange


def serve_generate(*, target: ServeTarget, body: dict, timeout_s: float | None = None) -> dict:
    """One chat completion, not streamed, through a serving worker (the background jobs' way in). It takes
    the endpoint's own way, on an event loop this thread keeps: a diff asks for an answer per scenario, and
    the loop's Redis connections serve them all."""
    body = {**serve_body_check(body), "stream": False}

    async def answer() -> bytes:
        exchange = await serve_exchange_start(target=target, body=body, timeout_s=timeout_s)
        return await exchange.answer()

    runner = getattr(_local, "runner", None)
    if runner is None:
        runner = _local.runner = asyncio.Runner(loop_factory=asyncio.new_event_loop)  # not the thread's loop
    return json.loads(runner.run(answer()))
