"""The serving thread (training.serving.worker) serves several requests at once, on the session's real vLLM
server, the way the serving tests run it (tests.e2e.serving: the thread in this process, the test
database and Redis). Requests are put on the queue and answered on their reply lists as the web side's
Exchange puts and reads them (training.serving.protocol).

A long answer (LONG_TOKENS, streamed, never ending early) stands for a request that is being served: the
tests look at what happens to other requests meanwhile, then cancel it as a caller that goes away does."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
import redis
from django.conf import settings

from tests.e2e import serving
from training.services.serving_gate import serving_paused
from training.services.steps.execute import adapter_name
from training.serving.protocol import (
    BODY,
    CANCEL_KEY,
    CHUNK,
    CLAIMED,
    END,
    ERROR,
    POP_S,
    QUEUE_KEY,
    REPLY_KEY,
    STARTED,
    ServeTarget,
)

served_run = serving.served_run  # the serving tests' fixtures
serving_worker = serving.serving_worker
LONG_TOKENS = 1500
BLOCKED_S = 1.0  # how long a request that should wait is given to (wrongly) be answered
ANSWER_S = 300  # the longest wait for an entry that must come (a loaded two-core machine)
MESSAGES = [{"role": "user", "content": "Tell me a long story about the sea."}]


class Request:
    """One request on the queue of served_run's base model, and its reply list."""

    def __init__(self, conn, served_run, body: dict, *, checkpoint: bool = True):
        run, ckpt = served_run["run"], served_run["checkpoint"]
        target = ServeTarget(
            requested="test",
            base_model_id=served_run["model"].id,
            adapter_name=adapter_name(run, ckpt.step) if checkpoint else None,
            adapter_path=ckpt.path if checkpoint else None,
        )
        self.conn = conn
        self.id = uuid.uuid4().hex
        self.reply_key = REPLY_KEY.format(request_id=self.id)
        payload = {"id": self.id, **target.as_request(), "body": {"messages": MESSAGES, **body}, "at": time.time()}
        conn.rpush(QUEUE_KEY.format(base_model_id=target.base_model_id), json.dumps(payload))

    def next(self, timeout: float = ANSWER_S) -> tuple[bytes, bytes] | None:
        """The next entry as (kind, data), or None after timeout seconds (in pops shorter than the
        connection's socket timeout, as the web side's)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            item = self.conn.blpop([self.reply_key], timeout=max(0.05, min(left, POP_S)))
            if item is not None:
                return item[1][:1], item[1][1:]
        return None

    def until(self, kind: bytes) -> list[bytes]:
        """The kinds of the entries up to and including the first of this kind."""
        seen = []
        while not seen or seen[-1] != kind:
            entry = self.next()
            assert entry is not None, f"no {kind!r} in time after {seen}"
            assert entry[0] != ERROR, entry
            seen.append(entry[0])
        return seen

    def left(self) -> list[bytes]:
        """The kinds of the entries not read yet."""
        return [entry[:1] for entry in self.conn.lrange(self.reply_key, 0, -1)]

    def cancel(self) -> None:
        self.conn.set(CANCEL_KEY.format(request_id=self.id), 1, ex=60)

    def cancel_and_end(self) -> None:
        """Cancel it, as a caller that goes away does, and read on to its end."""
        self.cancel()
        while (entry := self.next()) is not None and entry[0] != END:
            pass
        assert entry is not None, "it did not stop"


@pytest.fixture
def send(served_run, serving_worker):
    """send(body, checkpoint=True) -> Request: put a request for served_run's checkpoint (or its base model)
    on the queue of a serving thread that serves that base model. Requests still being answered at the end
    are cancelled, so that the serving thread stops in time."""
    conn = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=30)
    serving_worker(served_run["model"])
    sent: list[Request] = []

    def send(body: dict, *, checkpoint: bool = True) -> Request:
        sent.append(Request(conn, served_run, body, checkpoint=checkpoint))
        return sent[-1]

    yield send
    for request in sent:
        request.cancel()
    conn.close()


def _long(send, **kw) -> Request:
    """A request being answered: streamed, LONG_TOKENS tokens, its first chunk already here."""
    request = send({"stream": True, "max_tokens": LONG_TOKENS, "ignore_eos": True, "temperature": 1.0}, **kw)
    assert request.until(CHUNK) == [CLAIMED, STARTED, CHUNK]
    return request


def _short(send, **kw) -> Request:
    return send({"max_tokens": 4, "ignore_eos": True, "temperature": 0}, **kw)


def test_it_answers_a_request_while_another_is_still_being_answered(send):
    long = _long(send)
    short = _short(send)
    assert short.until(END) == [CLAIMED, STARTED, BODY, END]
    assert END not in long.left()  # the first is still being answered
    long.cancel_and_end()


def test_a_request_for_weights_the_server_cannot_hold_beside_waits_for_those_being_answered(send, vllm_server):
    """On the CPU build the server holds one set of weights at a time (merged mode): a request for the base
    model waits until the checkpoint's answer is done, and is then answered by the base model. A server
    with runtime adapters (ARTWEB_TEST_VLLM_ADAPTER_MODE=lora) answers both at once."""
    long = _long(send)
    base = _short(send, checkpoint=False)
    if not vllm_server.merged:
        assert base.until(END) == [CLAIMED, STARTED, BODY, END]
        assert END not in long.left()
        return
    assert base.next() == (CLAIMED, b"")
    assert base.next(BLOCKED_S) is None  # not started beside the checkpoint's answer
    assert END not in long.left()
    long.cancel_and_end()
    assert base.until(END) == [STARTED, BODY, END]
    assert vllm_server.adapters == {}  # the base model's weights are the ones loaded now


def test_a_step_waits_for_the_requests_being_answered_and_those_that_come_wait_for_it(send, vllm_server, settings):
    """Where requests are answered on the step's server between steps: merged mode without a second server
    (ARTWEB_SERVE_THREADS=0; tests/e2e/test_serve_during_step_e2e.py has requests answered during a step)."""
    if not vllm_server.merged:
        pytest.skip("a server with runtime adapters answers requests beside the steps; no gate is taken")
    settings.ARTWEB = {**settings.ARTWEB, "SERVE_THREADS": 0}
    long = _long(send)
    entered, release = threading.Event(), threading.Event()

    def step() -> None:
        with serving_paused():
            entered.set()
            assert release.wait(ANSWER_S)

    thread = threading.Thread(target=step, daemon=True)
    thread.start()
    try:
        assert not entered.wait(BLOCKED_S)  # a request is being answered
        late = _short(send)
        # The serving thread leaves it on the queue for the step's end (unless it took it just before the step
        # came, and then it waits at the gate): in either case it is not answered yet.
        early = late.next(BLOCKED_S)
        assert early in (None, (CLAIMED, b""))
        assert END not in long.left()
        long.cancel_and_end()
        assert entered.wait(60)  # the step holds the gate now, with the late request not started
        assert STARTED not in late.left()
        release.set()
        assert [CLAIMED] * (early is not None) + late.until(END) == [CLAIMED, STARTED, BODY, END]
    finally:
        release.set()  # never a step left holding the gate for the tests after this one
        thread.join(10)
