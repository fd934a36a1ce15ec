"""The Redis cache, storing JSON instead of pickles.

Django's RedisCache pickles values, and unpickling runs whatever the bytes say: anyone who can write to
Redis (another tenant of a shared Redis, a compromised worker) would run code in the web process. JSON
decodes to data only. A value that is not JSON (planted, or pickled by an earlier version) reads as a
miss, so callers get their default and overwrite it.
"""

from __future__ import annotations

import json
import logging

from django.core.cache.backends.redis import RedisCache, RedisCacheClient

log = logging.getLogger(__name__)


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
