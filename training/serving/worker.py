"""The serving thread of a GPU worker: it takes requests to the OpenAI-compatible endpoint from the Redis
list of the base model its inference server holds (any list while it holds none), waits for the worker's
gate (training.services.serving_gate: a run step holds it from start to end, so requests are served
between training steps, never while a batch's rollouts, or a jail's, use the server), loads the adapter
through an AdapterCache (LRU), calls vLLM directly with the server's key, and puts the answer on the
request's reply list (training.serving.protocol). artweb.celery starts it in the process that holds the
inference server.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time

import redis
from django.conf import settings
from django.db import close_old_connections, connections

from rollouts.inference.adapter_cache import AdapterCache
from training.models import PretrainedModel
from training.services import inference
from training.services.serving_gate import gate
from training.serving.protocol import ALIVE_KEY, ALIVE_TTL_S, QUEUE_KEY, ReplyWriter

logger = logging.getLogger(__name__)

_caches: dict[int, AdapterCache] = {}  # id(VLLMServer) -> AdapterCache
_thread: threading.Thread | None = None
_stop = threading.Event()
_http = None


@functools.cache
def _redis() -> redis.Redis:
    """One client (and connection pool) per process. redis-py's pool starts afresh in a forked child."""
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=30)


def adapter_cache_for(server) -> AdapterCache:
    cache = _caches.get(id(server))
    if cache is None or cache.server is not server:
        cache = _caches[id(server)] = AdapterCache(server, capacity=int(settings.ARTWEB["SERVE_ADAPTERS"]))
    return cache


def serve_loop_start() -> None:
    """Start this process's serving thread unless it runs (a pool child forks without it)."""
    global _thread
    if _thread is not None and _thread.is_alive():
        return
    _stop.clear()
    _thread = threading.Thread(target=_loop, name="artweb-serving", daemon=True)
    _thread.start()


def serve_loop_stop(timeout: float = 10.0) -> None:
    """Stop the serving thread after the request it is on (the worker's shutdown, the tests)."""
    _stop.set()
    if _thread is not None:
        _thread.join(timeout)


def _queues() -> list[str]:
    models = list(PretrainedModel.objects.all())
    server = inference._server
    if server is not None and server.is_alive():
        mine = [m for m in models if inference._served_as(m) == inference._server_model]
        if mine:
            models = mine  # a worker holding a model's weights serves that model (another would restart vLLM)
    return [QUEUE_KEY.format(base_model_id=m.id) for m in models]


def _loop() -> None:
    conn = _redis()
    queues: list[str] = []
    refreshed = 0.0
    while not _stop.is_set():
        try:
            conn.set(ALIVE_KEY, os.getpid(), ex=ALIVE_TTL_S)
            if time.monotonic() - refreshed > 2 or not queues:
                _close_connections()
                queues = _queues()
                refreshed = time.monotonic()
            item = conn.blpop(queues, timeout=2) if queues else time.sleep(2)
            if item:
                try:
                    serve_request_handle(json.loads(item[1]), conn=conn)
                finally:
                    _close_connections()
        except Exception:
            logger.exception("serving loop")
            time.sleep(1)
    connections.close_all()  # this thread's: a stopped loop holds no database connection


def _close_connections() -> None:
    try:
        close_old_connections()
    except Exception:  # a database that went away: the next query reconnects
        logger.debug("closing database connections failed", exc_info=True)


def _client():
    global _http
    import httpx

    if _http is None:
        # Kept-alive connections to the local vLLM: a new connection per request would add to each first token.
        _http = httpx.Client(timeout=httpx.Timeout(600.0, connect=5.0))
    return _http


def serve_request_handle(request: dict, *, conn) -> None:
    """Serve one queued request: the gate, the policy, vLLM, the answer back chunk by chunk."""
    reply = ReplyWriter(conn, request["id"])
    reply.claim()
    with gate:
        if reply.cancelled():
            return
        base_model = PretrainedModel.objects.filter(id=request["base_model"]).first()
        if base_model is None:
            return reply.fail(404, "That base model was deleted.", "model_not_found")
        try:
            server, name = _policy(base_model, request.get("adapter"))
        except Exception as exc:
            logger.exception("serving: could not load the model")
            return reply.fail(503, f"The worker could not load the model: {type(exc).__name__}: {exc}")
        try:
            _forward(server, {**request["body"], "model": name}, reply)
        except Exception as exc:
            logger.exception("serving: vLLM request failed")
            return reply.fail(502, f"The inference server failed: {type(exc).__name__}: {exc}")


def _policy(base_model, adapter: dict | None):
    """This worker's inference server with the model asked for ready: (server, the name vLLM serves it as)."""
    server = inference.inference_server(base_model)
    if not adapter:
        return server, server.ensure_base()
    before = dict(server.adapters)
    name = adapter_cache_for(server).ensure(adapter["name"], adapter["path"])
    if server.adapters != before:
        inference.adapters_loaded_publish()  # checkpoint deletion refuses adapters that are loaded
    return server, name


def _forward(server, body: dict, reply: ReplyWriter) -> None:
    """vLLM's answer onto the reply list, and its end: the whole of it, or chunk by chunk while the caller
    listens; vLLM's error as an error entry."""
    with _client().stream("POST", f"{server.base_url}/chat/completions", json=body, headers=server.headers) as response:
        if response.status_code != 200:
            text = response.read().decode(errors="replace")
            try:
                message = json.loads(text).get("error", {}).get("message") or text
            except (ValueError, AttributeError):
                message = text
            return reply.fail(response.status_code, str(message)[:2000])
        reply.start()
        if not body.get("stream"):
            reply.body(response.read())
        else:
            for count, line in enumerate(response.iter_lines()):
                if line.startswith("data: "):
                    reply.chunk(line[6:].encode())
                if count % 32 == 31 and reply.cancelled():
                    break  # the caller went away
    reply.end()
