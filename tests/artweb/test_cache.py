"""The Django cache keeps JSON in the real Redis and never unpickles what it finds there."""

import pickle
import uuid

import pytest
import redis
from django.conf import settings
from django.core.cache import cache
from rest_framework.test import APIRequestFactory
from rest_framework.throttling import SimpleRateThrottle


class PlantedPayload:
    """Unpickling this opens (creates) a file: a stand-in for whatever code an attacker would run."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture
def key():
    return f"artweb:test-cache:{uuid.uuid4().hex}"


@pytest.fixture
def raw_redis():
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    client.close()


def test_it_never_unpickles_a_value_planted_in_redis(key, raw_redis, tmp_path):
    flag = tmp_path / "code-ran"
    payload = pickle.dumps(PlantedPayload(str(flag)))
    raw_redis.set(cache.make_key(key), payload, ex=60)

    assert cache.get(key) is None
    assert cache.get(key, "fallback") == "fallback"  # read as a miss: callers get their default
    assert cache.get_many([key]) == {}
    assert not flag.exists()

    # The payload is live: Django's default (pickling) serializer would have run it.
    pickle.loads(payload)
    assert flag.exists()


def test_it_stores_json_in_redis(key, raw_redis):
    value = {"paths": ["/a", "/b"], "n": 2, "ratio": 0.5, "ok": True, "none": None}
    cache.set(key, value, 60)
    assert raw_redis.get(cache.make_key(key)).startswith(b"{")
    assert cache.get(key) == value
    assert cache.get_many([key]) == {key: value}
    with pytest.raises(TypeError, match="JSON values only"):
        cache.set(key, {1, 2}, 60)
    cache.delete(key)


def test_counters_locks_and_flags_work_as_before(key):
    cache.set(key, 1, 60)
    assert cache.incr(key, 2) == 3 and cache.get(key) == 3
    assert cache.add(f"{key}:lock", "token", 60) and not cache.add(f"{key}:lock", "other", 60)
    assert cache.get(f"{key}:lock") == "token"
    cache.set(f"{key}:flag", True, 60)
    assert cache.get(f"{key}:flag") is True
    cache.delete_many([key, f"{key}:lock", f"{key}:flag"])


def test_drf_throttling_keeps_its_history_in_it(key):
    class TwoAMinute(SimpleRateThrottle):
        rate = "2/min"

        def get_cache_key(self, request, view):
            return key

    request = APIRequestFactory().post("/")
    assert [TwoAMinute().allow_request(request, None) for _ in range(3)] == [True, True, False]
    throttle = TwoAMinute()
    assert not throttle.allow_request(request, None) and 0 < throttle.wait() <= 60
    cache.delete(key)
