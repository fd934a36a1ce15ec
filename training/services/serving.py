"""Serving trained checkpoints: which model a name means, and how a request reaches a worker's vLLM.

The design (see the README, "Use what you trained"):

- The web process resolves `model` (a base model, `<run>@<step|best|latest>`, or an alias) for the
  token's user, then puts the request on a Redis list of that base model (`artweb:serve:q:<id>`).
- Each GPU worker runs one serving thread (started with the worker's pool process, artweb.celery). It
  takes requests from the list of the base model its inference server holds (any list while it holds
  none), waits for the worker's gate (a run step holds it from start to end: requests are served
  between training steps, never while a batch's rollouts, or a jail's, use the server), loads the
  adapter through an AdapterCache (LRU, rollouts.runtime.adapter_cache), and calls vLLM directly with
  the server's key: not through any batch's proxy or jail.
- vLLM's answer goes back on a Redis list of the request (`artweb:serve:r:<id>`), one entry per
  streamed chunk, which the web process relays as it arrives. Redis lists make the hand-over a
  blocking pop on both sides: no polling, well under a millisecond per chunk.

Entries on a request's reply list: b"c" (a worker took it), b"s" (vLLM answered 200), b"d" + one
streamed chunk's JSON, b"b" + a whole JSON answer, b"x" + {"status", "body"} (an error), b"e" (done).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass

import redis
from django.conf import settings
from django.db import close_old_connections
from django.db.models import Q

from rollouts.runtime.adapter_cache import AdapterCache
from training.models import Checkpoint, CheckpointAlias, PretrainedModel, Run
from training.services import inference
from training.services.serving_gate import gate
from training.services.steps import adapter_name

logger = logging.getLogger(__name__)

QUEUE_KEY = "artweb:serve:q:{base_model_id}"
REPLY_KEY = "artweb:serve:r:{request_id}"
CANCEL_KEY = "artweb:serve:cancel:{request_id}"
ALIVE_KEY = "artweb:serve:alive"  # set (with a TTL) while at least one worker's serving thread runs
REPLY_TTL_S = 900
ALIVE_TTL_S = 30
MAX_SAMPLES = 16  # n per request: a request holds the worker's gate while it runs


class ServeError(Exception):
    """An answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param

    def as_dict(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ServeTarget:
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


# --- which model a name means ----------------------------------------------------------------------


def _not_found(name: str) -> ServeError:
    return ServeError(
        404,
        f"The model '{name}' does not exist or you do not have access to it. GET /api/v1/openai/models lists "
        "the names you may use: base models, <run>@<step>, <run>@best, <run>@latest and your aliases.",
        code="model_not_found",
        param="model",
    )


def _servable_base_models(user):
    return PretrainedModel.objects.filter(Q(owner__isnull=True) | Q(owner=user))


def _run_for(user, ref: str) -> Run | None:
    """A run of the user's by id (`7`, `run-7`) or by name (the newest of that name)."""
    runs = Run.objects.filter(owner=user).select_related("base_model")
    digits = ref.removeprefix("run-")
    if digits.isdigit():
        found = runs.filter(id=int(digits)).first()
        if found is not None:
            return found
    return runs.filter(name=ref).order_by("-created_at", "-id").first()


def _target(requested: str, ckpt: Checkpoint) -> ServeTarget:
    return ServeTarget(
        requested=requested,
        base_model_id=ckpt.run.base_model_id,
        adapter_name=adapter_name(ckpt.run, ckpt.step),
        adapter_path=ckpt.path,
        checkpoint_id=ckpt.id,
    )


def serve_model_resolve(*, user, name: str) -> ServeTarget:
    """What `model=name` means for this user; ServeError 404 for anything not theirs (or not there)."""
    if not isinstance(name, str) or not name.strip():
        raise ServeError(400, "Name a model: the field 'model' is required.", param="model")
    name = name.strip()
    base = _servable_base_models(user).filter(name=name).first()
    if base is not None:
        return ServeTarget(requested=name, base_model_id=base.id)
    alias = (
        CheckpointAlias.objects.filter(owner=user, name=name, checkpoint__state=Checkpoint.State.ACTIVE)
        .select_related("checkpoint__run")
        .first()
    )
    if alias is not None:
        return _target(name, alias.checkpoint)
    run_ref, sep, which = name.rpartition("@")
    if not sep or not run_ref:
        raise _not_found(name)
    run = _run_for(user, run_ref)
    if run is None:
        raise _not_found(name)
    active = Checkpoint.objects.filter(run=run, state=Checkpoint.State.ACTIVE).select_related("run")
    if which == "latest":
        ckpt = active.order_by("-step").first()
    elif which == "best":
        ckpt = active.filter(val_reward__isnull=False).order_by("-val_reward", "-step").first()
        if ckpt is None:
            ckpt = active.filter(promoted=True).first() or active.order_by("-step").first()
    elif which.isdigit():
        ckpt = active.filter(step=int(which)).first()
    else:
        raise ServeError(
            400, f"'{which}' is not a step: use <run>@<step number>, <run>@best or <run>@latest.", param="model"
        )
    if ckpt is None:
        raise _not_found(name)
    return _target(name, ckpt)


def serve_model_list(*, user) -> list[dict]:
    """Every name the user may send as `model`, in OpenAI's model-list entries."""
    out = []
    for base in _servable_base_models(user).order_by("name"):
        out.append(_model_entry(base.name, base.created_at, "artweb" if base.owner_id is None else user.username))
    for alias in CheckpointAlias.objects.filter(owner=user, checkpoint__state=Checkpoint.State.ACTIVE).order_by("name"):
        out.append(_model_entry(alias.name, alias.created_at, user.username))
    ckpts = (
        Checkpoint.objects.filter(run__owner=user, state=Checkpoint.State.ACTIVE)
        .select_related("run")
        .order_by("run_id", "step")
    )
    seen_runs = set()
    for ckpt in ckpts:
        if ckpt.run_id not in seen_runs:
            seen_runs.add(ckpt.run_id)
            for which in ("latest", "best"):
                out.append(_model_entry(f"run-{ckpt.run_id}@{which}", ckpt.run.created_at, user.username))
        out.append(_model_entry(f"run-{ckpt.run_id}@{ckpt.step}", ckpt.created_at, user.username))
    return out


def _model_entry(name: str, created, owner: str) -> dict:
    return {"id": name, "object": "model", "created": int(created.timestamp()), "owned_by": owner}


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


# --- the web side: hand a request to a worker, relay its answer --------------------------------------


@functools.cache
def _redis() -> redis.Redis:
    """One client (and connection pool) per process: a diff job asks for an answer per scenario, and a
    new pool each time opened a new connection each time. redis-py's pool starts afresh in a forked child."""
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=30)


def _timeout_s() -> float:
    return float(settings.ARTWEB["SERVE_TIMEOUT_SECONDS"])


def _no_worker(target: ServeTarget) -> ServeError:
    return ServeError(
        503,
        "No GPU worker is serving models right now; start one (make run starts it) and try again.",
        code="no_worker",
    )


def _request_payload(target: ServeTarget, body: dict) -> tuple[str, bytes]:
    request_id = uuid.uuid4().hex
    payload = json.dumps({"id": request_id, **target.as_request(), "body": body, "at": time.time()}).encode()
    return request_id, payload


def serve_generate(*, target: ServeTarget, body: dict, timeout_s: float | None = None) -> dict:
    """One chat completion, not streamed, through a serving worker (the background jobs' way in)."""
    body = {**serve_body_check(body), "stream": False}
    conn = _redis()
    if not conn.exists(ALIVE_KEY):
        raise _no_worker(target)
    request_id, payload = _request_payload(target, body)
    reply = REPLY_KEY.format(request_id=request_id)
    queue = QUEUE_KEY.format(base_model_id=target.base_model_id)
    conn.rpush(queue, payload)
    deadline = time.monotonic() + (timeout_s or _timeout_s())
    claimed = False
    while True:
        left = deadline - time.monotonic()
        item = conn.blpop([reply], timeout=max(0.05, min(left, 10))) if left > 0 else None
        if item is None and time.monotonic() < deadline:
            continue
        if item is None:
            if not claimed and conn.lrem(queue, 1, payload):
                raise ServeError(503, f"No worker took the request within {timeout_s or _timeout_s():g} s.")
            conn.set(CANCEL_KEY.format(request_id=request_id), 1, ex=REPLY_TTL_S)
            raise ServeError(504, "The worker did not answer in time.")
        data = item[1]
        kind, rest = data[:1], data[1:]
        if kind == b"c":
            claimed = True
        elif kind == b"x":
            error = json.loads(rest)
            raise ServeError(error["status"], error["message"], code=error.get("code"))
        elif kind == b"b":
            answer = json.loads(rest)
            answer["model"] = target.requested
            return answer


# --- the worker side ----------------------------------------------------------------------------------

_caches: dict[int, object] = {}  # id(VLLMServer) -> AdapterCache
_thread: threading.Thread | None = None
_stop = threading.Event()


def adapter_cache_for(server):
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


def _queues(conn) -> list[str]:
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
                queues = _queues(conn)
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


def _close_connections() -> None:
    try:
        close_old_connections()
    except Exception:  # a database that went away: the next query reconnects
        logger.debug("closing database connections failed", exc_info=True)


_http = None


def _client():
    global _http
    import httpx

    if _http is None:
        # Kept-alive connections to the local vLLM: a new connection per request would add to each first token.
        _http = httpx.Client(timeout=httpx.Timeout(600.0, connect=5.0))
    return _http


def serve_request_handle(request: dict, *, conn) -> None:
    """Serve one queued request: the gate, the policy, vLLM, the answer back chunk by chunk."""
    request_id = request["id"]
    reply = REPLY_KEY.format(request_id=request_id)
    cancel = CANCEL_KEY.format(request_id=request_id)

    def send(data: bytes) -> None:
        conn.rpush(reply, data)

    def fail(status: int, message: str, code: str | None = None) -> None:
        send(b"x" + json.dumps({"status": status, "message": message, "code": code}).encode())
        send(b"e")

    conn.pipeline(transaction=False).rpush(reply, b"c").expire(reply, REPLY_TTL_S).execute()
    with gate:
        if conn.exists(cancel):
            return
        base_model = PretrainedModel.objects.filter(id=request["base_model"]).first()
        if base_model is None:
            return fail(404, "That base model was deleted.", "model_not_found")
        try:
            server = inference.inference_server(base_model)
            adapter = request.get("adapter")
            if adapter:
                before = dict(server.adapters)
                name = adapter_cache_for(server).ensure(adapter["name"], adapter["path"])
                if server.adapters != before:
                    inference.adapters_loaded_publish()  # checkpoint deletion refuses adapters that are loaded
            else:
                name = server.ensure_base()
        except Exception as exc:
            logger.exception("serving: could not load the model")
            return fail(503, f"The worker could not load the model: {type(exc).__name__}: {exc}")
        body = {**request["body"], "model": name}
        stream = bool(body.get("stream"))
        try:
            with _client().stream(
                "POST", f"{server.base_url}/chat/completions", json=body, headers=server.headers
            ) as response:
                if response.status_code != 200:
                    text = response.read().decode(errors="replace")
                    try:
                        message = json.loads(text).get("error", {}).get("message") or text
                    except (ValueError, AttributeError):
                        message = text
                    return fail(response.status_code, str(message)[:2000])
                send(b"s")
                if not stream:
                    send(b"b" + response.read())
                else:
                    for count, line in enumerate(response.iter_lines()):
                        if line.startswith("data: "):
                            send(b"d" + line[6:].encode())
                        if count % 32 == 31 and conn.exists(cancel):
                            break  # the caller went away
        except Exception as exc:
            logger.exception("serving: vLLM request failed")
            return fail(502, f"The inference server failed: {type(exc).__name__}: {exc}")
        send(b"e")
