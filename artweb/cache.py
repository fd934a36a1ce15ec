"""The Redis cache, storing JSON instead of pickles.

Django's RedisCache pickles values, and unpickling runs whatever the bytes say: anyone who can write to
Redis (another tenant of a shared Redis, a compromised worker) would run code in the web process. JSON
decodes to data only. A value that is not JSON (planted, or pickled by an earlier version) reads as a
miss, so callers get their default and overwrite it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.core.cache.backends.redis import RedisCache, RedisCacheClient

log = logging.getLogger(__name__)

T = TypeVar("T")
# How long a Redis call on a step's path waits out an outage (a restart takes seconds), and its backoff.
OUTAGE_SECONDS = 60.0
BACKOFF_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)


class UnreadableCacheValue(ValueError):
    pass


class JsonSerializer:
    """dumps/loads for RedisCacheClient. Integers stay raw, as Django's own serializer keeps them, so
    Redis's INCR works on them (cache.incr)."""

    def dumps(self, obj):
        if type(obj) is int:  # not bool: True would come back as 1
            return obj
        try:
            return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"The cache stores JSON values only: {exc}. Convert the value to plain "
                "dicts, lists, strings and numbers first."
            ) from exc

    def loads(self, data):
        try:
            return int(data)
        except ValueError:
            pass
        try:
            return json.loads(data)
        except (UnicodeDecodeError, ValueError) as exc:
            raise UnreadableCacheValue(str(exc)) from exc


class JsonRedisCacheClient(RedisCacheClient):
    def __init__(self, servers, serializer=None, **options):
        super().__init__(servers, serializer=serializer or JsonSerializer, **options)

    def get(self, key, default):
        try:
            return super().get(key, default)
        except UnreadableCacheValue:
            log.warning("The cache value under %s is not JSON; treating it as missing.", key)
            return default

    def get_many(self, keys):
        keys = list(keys)
        values = self.get_client(None).mget(keys)
        out = {}
        for key, value in zip(keys, values, strict=True):
            if value is None:
                continue
            try:
                out[key] = self._serializer.loads(value)
            except UnreadableCacheValue:
                log.warning("The cache value under %s is not JSON; treating it as missing.", key)
        return out


class JsonRedisCache(RedisCache):
    """settings.CACHES backend: RedisCache with JsonRedisCacheClient."""

    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = JsonRedisCacheClient


def riding_out_outages(call: Callable[[], T], *, what: str, seconds: float | None = None) -> T:
    """call(), tried again with backoff while Redis cannot be reached, for up to `seconds` (OUTAGE_SECONDS):
    a worker's step goes on through a Redis restart instead of failing the run. The last error is raised
    when Redis is still away after that."""
    import redis

    deadline = time.monotonic() + (OUTAGE_SECONDS if seconds is None else seconds)
    for attempt in range(1_000_000):
        try:
            return call()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            wait = BACKOFF_SECONDS[min(attempt, len(BACKOFF_SECONDS) - 1)]
            if time.monotonic() + wait > deadline:
                raise
            log.warning("Redis unavailable for %s (%s); trying again in %.1f s", what, exc, wait)
            time.sleep(wait)
    raise AssertionError("unreachable")
