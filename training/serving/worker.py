"""The serving thread of a GPU worker: it takes requests to the OpenAI-compatible endpoint from the Redis
list of the base model its inference server holds (any list while it holds none) and serves up to
ARTWEB_SERVE_CONCURRENCY of them at once on a pool of threads, so that vLLM answers an ART client's
rollouts (16-64 chat completions at a time) as one batch, as it answers a script's.

Requests never wait for a run step (training.services.serving_server says where each is answered): on the
worker's inference server beside the step's rollouts where it holds adapters side by side ("lora" mode),
else on a second server of their own. Only where that second server cannot be (no memory for it, or
ARTWEB_SERVE_THREADS=0) does a request hold the worker's serving gate beside the others
(training.services.serving_gate: a run step holds it alone from start to end), and it is then served
between training steps. Each request waits until its policy may be made ready without taking weights from
under another request (Policies), makes it ready (the server, its adapter through an AdapterCache, LRU) one
request at a time, calls the server directly with its key, and puts the answer on the request's reply list
(training.serving.protocol). artweb.celery starts it in the process that holds the inference server.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import redis
from django.conf import settings
from django.db import close_old_connections, connections

from rollouts.inference.adapter_cache import SERVING_PREFIX, AdapterCache
from training.models import PretrainedModel
from training.services import inference, serving_server, warmup
from training.services.serving_gate import gate, serving_slot
from training.serving.protocol import ALIVE_KEY, ALIVE_TTL_S, QUEUE_KEY, ReplyWriter

logger = logging.getLogger(__name__)

_caches: dict[int, AdapterCache] = {}  # id(VLLMServer) -> AdapterCache
_caches_lock = threading.Lock()
_thread: threading.Thread | None = None
_stop = threading.Event()
_http: tuple[int, object] | None = None  # (connections it keeps, httpx.Client)
_http_lock = threading.Lock()


@functools.cache
def _redis() -> redis.Redis:
    """One client (and connection pool) per process, shared by the serving threads (redis-py's client is
    thread-safe). redis-py's pool starts afresh in a forked child."""
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=30)


def adapter_cache_for(server) -> AdapterCache:
    with _caches_lock:  # a request merges ahead of its turn outside Policies.load (_merge_ahead)
        cache = _caches.get(id(server))
        if cache is None or cache.server is not server:
            cache = _caches[id(server)] = AdapterCache(server, capacity=int(settings.ARTWEB["SERVE_ADAPTERS"]))
        return cache


@dataclasses.dataclass(frozen=True)
class Policy:
    """What a request is answered with: the base model as its server must hold it (inference._served_as)
    and the adapter on it, if any; and on which of the worker's servers (serving_server.route)."""

    served: str
    adapter: str | None = None  # the checkpoint's name (run-<id>@<step>)
    path: str | None = None
    route: str = serving_server.GATE


class Policies:
    """The policies the requests being served use, so that making one ready never takes weights from
    under a request that is being answered with another.

    Requests with the same policy are served together. Requests with different ones are only where the
    server holds them side by side: one base model's, in "lora" mode (vLLM's runtime adapters). Otherwise
    (merged mode holds one set of weights at a time; another base model means another server) a request
    waits until the requests using the others are done. Requests are let in in turns: the oldest waiting
    request goes first once it fits, and with it every request for its policy that was waiting then (one
    load serves them all, where requests that alternate between two policies would otherwise load weights
    for each); those that come later wait behind the oldest, so a stream of requests for one policy never
    starves a request for another.

    `load` is held while a request makes its policy ready: inference.inference_server() and the
    AdapterCache are not made for threads, and two loads must not race."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._using: collections.Counter[Policy] = collections.Counter()  # policy -> requests using it
        self._waiting: collections.deque[tuple[int, Policy]] = collections.deque()  # (ticket, policy), oldest first
        self._tickets = itertools.count()
        self._turn: tuple[Policy, int] | None = None  # the policy of the latest turn, and the last ticket it takes
        self.load = threading.Lock()

    @contextlib.contextmanager
    def hold(self, policy: Policy):
        with self._changed:
            ticket = next(self._tickets)
            self._waiting.append((ticket, policy))
            try:
                self._changed.wait_for(lambda: self._may_go(ticket, policy))
                if self._waiting[0][0] == ticket:  # the oldest: a turn of its policy starts
                    self._turn = (policy, self._waiting[-1][0])
            finally:
                self._waiting.remove((ticket, policy))
                self._changed.notify_all()  # the next one in line may fit too
            self._using[policy] += 1
        try:
            yield
        finally:
            with self._changed:
                self._using[policy] -= 1
                if not self._using[policy]:
                    del self._using[policy]
                self._changed.notify_all()

    def _may_go(self, ticket: int, policy: Policy) -> bool:
        """It fits beside the policies in use, and it is the oldest waiting, or was waiting when a turn of its
        policy started."""
        if not self._fits(policy):
            return False
        oldest = self._waiting[0][0] == ticket
        return oldest or (self._turn is not None and self._turn[0] == policy and ticket <= self._turn[1])

    def adapters_in_use(self, served: str) -> set[str]:
        """The adapters requests on this base model's server are answered with now (the cache keeps them)."""
        with self._changed:
            return {p.adapter for p in self._using if p.served == served and p.adapter}

    def _fits(self, policy: Policy) -> bool:
        return all(p == policy or _side_by_side(p, policy) for p in self._using)


def _side_by_side(a: Policy, b: Policy) -> bool:
    """The server holds both at once: the same server and base model, in "lora" mode, and not one name for
    two adapters. A server not started yet for that model counts as one that does not (its mode is unknown)."""
    same = a.served == b.served and a.route == b.route and not (a.adapter == b.adapter and a.path != b.path)
    return same and serving_server.side_by_side(a.route, a.served)


_policies = Policies()


def serve_loop_start() -> None:
    """Start this process's serving thread unless it runs (a pool child forks without it)."""
    global _thread
    if _thread is not None and _thread.is_alive():
        return
    _stop.clear()
    _thread = threading.Thread(
        target=_loop, args=(int(settings.ARTWEB["SERVE_CONCURRENCY"]),), name="artweb-serving", daemon=True
    )
    _thread.start()


def serve_loop_stop(timeout: float = 30.0) -> None:
    """Stop the serving thread once the requests it is serving are done (the worker's shutdown, the tests);
    waits up to timeout seconds."""
    _stop.set()
    if _thread is not None:
        _thread.join(timeout)


def _queues() -> list[str]:
    models = list(PretrainedModel.objects.all())
    held = serving_server.model_held()
    if held is not None:
        mine = [m for m in models if inference._served_as(m) == held]
        if mine:
            models = mine  # a worker holding a model's weights serves that model (another would restart vLLM)
    return [QUEUE_KEY.format(base_model_id=m.id) for m in models]


def _loop(concurrency: int) -> None:
    conn = _redis()
    queues: list[str] = []
    refreshed = 0.0
    slots = threading.BoundedSemaphore(max(1, concurrency))
    pool = ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="artweb-serving")
    try:
        while not _stop.is_set():
            try:
                conn.set(ALIVE_KEY, os.getpid(), ex=ALIVE_TTL_S)
                if time.monotonic() - refreshed > 2 or not queues:
                    _close_connections()
                    queues = _queues()
                    refreshed = time.monotonic()
                if queues:
                    _take(conn, queues, slots, pool)
                else:
                    _stop.wait(2)
            except Exception:
                logger.exception("serving loop")
                time.sleep(1)
    finally:
        pool.shutdown(wait=True)  # the requests being served finish
        connections.close_all()  # this thread's: a stopped loop holds no database connection


def _take(conn, queues: list[str], slots: threading.BoundedSemaphore, pool: ThreadPoolExecutor) -> None:
    """Hand the next request to a pool thread, if within a few seconds a slot is free and a request comes.
    Where requests wait for the steps (serving_server.waits_for_steps), none is taken while a step holds or
    waits for the gate: one this worker could not start now stays on the queue, for another worker to take."""
    if not slots.acquire(timeout=2):
        return
    submitted = False
    try:
        ready = not serving_server.waits_for_steps() or gate.wait_open(2)
        item = conn.blpop(queues, timeout=2) if ready else None
        if item:
            pool.submit(_serve, json.loads(item[1]), conn, slots)
            submitted = True
    finally:
        if not submitted:
            slots.release()


def _serve(request: dict, conn, slots: threading.BoundedSemaphore) -> None:
    """One request on a pool thread (once the process's warm-up imports are done, training.services.warmup);
    its slot is free again afterwards."""
    try:
        warmup.wait()
        serve_request_handle(request, conn=conn)
    except Exception:
        logger.exception("serving a request")
    finally:
        # This thread's database connections, closed whatever their age: the pool keeps up to
        # ARTWEB_SERVE_CONCURRENCY threads, which would otherwise keep as many connections open.
        connections.close_all()
        slots.release()


def _close_connections() -> None:
    try:
        close_old_connections()
    except Exception:  # a database that went away: the next query reconnects
        logger.debug("closing database connections failed", exc_info=True)


def _client():
    """The httpx client to the local vLLM, shared by the serving threads (httpx.Client is thread-safe)."""
    global _http
    import httpx

    size = int(settings.ARTWEB["SERVE_CONCURRENCY"])
    with _http_lock:
        if _http is None or _http[0] != size:
            # Kept-alive connections, one per request served at once: a new connection per request would
            # add to each first token.
            limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
            _http = (size, httpx.Client(timeout=httpx.Timeout(600.0, connect=5.0), limits=limits))
        return _http[1]


def serve_request_handle(request: dict, *, conn) -> None:
    """Serve one queued request: where (serving_server.route), the policy, the server, the answer back chunk
    by chunk."""
    if time.time() - float(request.get("at") or time.time()) > float(settings.ARTWEB["SERVE_TIMEOUT_SECONDS"]):
        return  # its caller gave up long ago (a web process that went away left it on the queue)
    reply = ReplyWriter(conn, request["id"])
    reply.claim()
    base_model = PretrainedModel.objects.filter(id=request["base_model"]).first()
    if base_model is None:
        return reply.fail(404, "That base model was deleted.", "model_not_found")
    try:
        served = inference._served_as(base_model)  # may write the model's chat template to a file
        route = serving_server.route(base_model)
    except Exception as exc:
        logger.exception("serving: could not read the model")
        return reply.fail(503, f"The worker could not load the model: {type(exc).__name__}: {exc}")
    adapter = request.get("adapter") or {}
    policy = Policy(served, adapter.get("name"), adapter.get("path"), route)
    if route == serving_server.OWN:
        try:
            return _answer(request, reply, policy, lambda: serving_server.server(base_model))
        except serving_server.ServingServerRefused:
            policy = dataclasses.replace(policy, route=serving_server.GATE)  # it could not start (logged)
    if route == serving_server.BESIDE:
        with inference.server_beside(base_model) as server:
            if server is not None:
                return _answer(request, reply, policy, lambda: server)
        # None runs for this model to share: its start, or a switch to it, waits for the step.
        policy = dataclasses.replace(policy, route=serving_server.GATE)
    with serving_slot():
        _answer(request, reply, policy, lambda: inference.inference_server(base_model))


def _answer(request: dict, reply: ReplyWriter, policy: Policy, server_for) -> None:
    """Answer the request on server_for() once its policy may be made ready (Policies). A server that holds
    adapters side by side gets the request's adapter under a name of the endpoint's own (SERVING_PREFIX)."""
    if reply.cancelled():
        return
    served = policy.served
    _merge_ahead(policy)
    with _policies.hold(policy):
        if reply.cancelled():  # it may have waited for other requests
            return
        try:
            with _policies.load:
                server = server_for()
                name = _ready(server, policy, keep=_policies.adapters_in_use(served))
        except serving_server.ServingServerRefused:
            raise
        except Exception as exc:
            logger.exception("serving: could not load the model")
            return reply.fail(503, f"The worker could not load the model: {type(exc).__name__}: {exc}")
        try:
            _forward(server, {**request["body"], "model": name}, reply)
        except Exception as exc:
            logger.exception("serving: vLLM request failed")
            return reply.fail(502, f"The inference server failed: {type(exc).__name__}: {exc}")


def _merge_ahead(policy: Policy) -> None:
    """A checkpoint's merged copy, written before its request waits for its turn (on a server that holds one
    policy at a time, already running for its model): requests answered meanwhile are not held up by it."""
    if not policy.adapter:
        return
    server, model = serving_server.server_of(policy.route)
    if server is None or model != policy.served or not server.merged or not server.is_alive():
        return
    try:
        adapter_cache_for(server).prepare(policy.adapter, policy.path)
    except Exception:  # its turn tries again, and answers with the reason
        logger.warning("serving: merging %s ahead of its turn failed", policy.adapter, exc_info=True)


def _ready(server, policy: Policy, *, keep: set[str]) -> str:
    """The policy made ready on the server: the name to ask it for. keep: adapters other requests are being
    answered with, which the cache must not let go of now. A server that holds adapters side by side may hold
    a step's too: the endpoint's own go by names of their own there (SERVING_PREFIX + run-<id>@<step>)."""
    if not policy.adapter:
        return server.ensure_base()
    prefix = "" if server.merged else SERVING_PREFIX
    before = dict(server.adapters)
    name = adapter_cache_for(server).ensure(prefix + policy.adapter, policy.path, keep={prefix + n for n in keep})
    if server.adapters != before:
        inference.adapters_loaded_publish()  # checkpoint deletion refuses adapters that are loaded
    return name


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
