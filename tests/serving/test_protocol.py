"""The hand-over between the web side (Exchange, serve_generate) and a worker's serving thread (ReplyWriter)
over the test Redis: a worker here is a thread that writes the entries a serving thread writes."""

from __future__ import annotations

import json
import random
import threading

import pytest
import redis
import redis.asyncio as aioredis
from django.conf import settings

from training.serving.protocol import (
    ALIVE_KEY,
    QUEUE_KEY,
    Exchange,
    ReplyWriter,
    ServeError,
    ServeTarget,
)
from training.serving.services.serving import serve_generate

BODY = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def conn():
    conn = redis.Redis.from_url(settings.REDIS_URL)
    conn.set(ALIVE_KEY, 1, ex=60)
    yield conn
    conn.delete(ALIVE_KEY)
    conn.close()


@pytest.fixture
async def web():
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    yield client
    await client.aclose()


@pytest.fixture
def target():
    return ServeTarget(requested="my-alias", base_model_id=random.randrange(10**9, 2 * 10**9))


def _worker(conn, target, write) -> threading.Thread:
    """A thread that takes the next request for target's base model and answers it with write(reply)."""

    def run() -> None:
        item = conn.blpop([QUEUE_KEY.format(base_model_id=target.base_model_id)], timeout=10)
        request = json.loads(item[1])
        assert request["base_model"] == target.base_model_id and request["body"]["messages"]
        write(ReplyWriter(conn, request["id"]))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _answer(reply: ReplyWriter) -> None:
    reply.claim()
    reply.start()
    reply.body(b'{"model": "run-7@1", "choices": [{"index": 0, "message": {"content": "hello"}}]}')
    reply.end()


async def test_it_relays_the_whole_answer_under_the_name_the_caller_used(conn, web, target):
    thread = _worker(conn, target, _answer)
    exchange = Exchange(web, target, BODY, timeout_s=10)
    await exchange.start()
    answer = json.loads(await exchange.answer())
    thread.join(5)
    assert answer["model"] == "my-alias" and answer["choices"][0]["message"]["content"] == "hello"
    assert exchange.claimed and not conn.exists(exchange.cancel_key)


async def test_the_workers_error_is_the_callers(conn, web, target):
    def fail(reply: ReplyWriter) -> None:
        reply.claim()
        reply.fail(404, "That base model was deleted.", "model_not_found")

    thread = _worker(conn, target, fail)
    exchange = Exchange(web, target, BODY, timeout_s=10)
    with pytest.raises(ServeError) as caught:
        await exchange.start()
    thread.join(5)
    assert caught.value.status == 404 and caught.value.as_dict()["error"]["code"] == "model_not_found"


async def test_a_stream_relays_chunks_renamed_an_error_as_an_event_and_ends_at_the_end(conn, web, target):
    def stream(reply: ReplyWriter) -> None:
        reply.claim()
        reply.start()
        reply.chunk(b'{"model": "run-7@1", "choices": [{"delta": {"content": "he"}}]}')
        reply.chunk(b"[DONE]")
        reply.fail(502, "The inference server failed: ReadError: gone")

    thread = _worker(conn, target, stream)
    exchange = Exchange(web, target, {**BODY, "stream": True}, timeout_s=10)
    await exchange.start()
    events = [event async for event in exchange.events()]
    thread.join(5)
    assert json.loads(events[0].removeprefix(b"data: "))["model"] == "my-alias"
    assert events[1] == b"data: [DONE]\n\n"
    assert json.loads(events[2].removeprefix(b"data: "))["error"]["message"].startswith("The inference server failed")
    assert len(events) == 3 and not conn.exists(exchange.cancel_key)  # it ended: nothing to cancel


async def test_a_request_no_worker_took_is_taken_back_and_a_silent_one_cancelled(conn, web, target):
    exchange = Exchange(web, target, BODY, timeout_s=0.3)
    with pytest.raises(ServeError) as caught:
        await exchange.start()
    assert caught.value.status == 503 and "try again" in caught.value.message
    assert not conn.llen(exchange.queue_key)

    thread = _worker(conn, target, lambda reply: reply.claim())
    exchange = Exchange(web, target, BODY, timeout_s=1)
    with pytest.raises(ServeError) as caught:
        await exchange.start()
    thread.join(5)
    assert caught.value.status == 504 and conn.exists(exchange.cancel_key)  # the worker skips it, or stops


async def test_without_a_serving_worker_the_request_is_not_queued(conn, web, target):
    conn.delete(ALIVE_KEY)
    exchange = Exchange(web, target, BODY, timeout_s=10)
    with pytest.raises(ServeError) as caught:
        await exchange.start()
    assert caught.value.status == 503 and caught.value.code == "no_worker"
    assert not conn.llen(exchange.queue_key)


def test_the_background_jobs_take_the_same_way_on_a_loop_of_their_thread(conn, target):
    for _ in range(2):  # the second call reuses the thread's loop and its Redis client
        thread = _worker(conn, target, _answer)
        answer = serve_generate(target=target, body=BODY, timeout_s=10)
        thread.join(5)
        assert answer["model"] == "my-alias" and answer["choices"][0]["message"]["content"] == "hello"
