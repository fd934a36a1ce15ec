"""A Redis call on a step's path waits out a Redis restart (artweb.cache.riding_out_outages)."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from artweb.cache import riding_out_outages
from artweb.testing.private_redis import PrivateRedis


@pytest.fixture
def private(tmp_path):
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    if server.proc.poll() is None:
        server.kill()


def test_a_call_during_a_restart_succeeds_once_redis_is_back(private):
    client = redis.Redis.from_url(private.url, socket_connect_timeout=1, socket_timeout=1)
    client.set("k", "before")
    private.kill()
    threading.Timer(2.0, private.start).start()  # back 2 s later, empty
    started = time.monotonic()
    assert riding_out_outages(lambda: client.set("k", "after"), what="a test key") is True
    waited = time.monotonic() - started
    print(f"waited {waited:.2f} s for Redis to come back")
    assert 1.5 < waited < 15
    assert client.get("k") == b"after"


def test_redis_away_longer_than_the_limit_raises_the_last_error(private):
    client = redis.Redis.from_url(private.url, socket_connect_timeout=1, socket_timeout=1)
    private.kill()
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        riding_out_outages(lambda: client.get("k"), what="a test key", seconds=1.5)
    assert time.monotonic() - started < 5
