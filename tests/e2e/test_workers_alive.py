"""/metrics counts an idle worker as alive: a real default-queue worker process, no run anywhere."""

from __future__ import annotations

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from artweb.testing import stack
from training.sweeper import ALIVE_PREFIX

pytestmark = pytest.mark.timeout(180)


def _alive(client) -> dict[str, float]:
    text = client.get("/metrics").content.decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("artweb_workers_alive")
    }


def test_an_idle_worker_is_counted_alive_until_it_stops(stack_env, procs, tmp_path, client, admin_user, settings):
    store = redis.Redis.from_url(settings.REDIS_URL)
    for key in store.scan_iter(match=f"{ALIVE_PREFIX}*"):
        store.delete(key)
    client.force_login(admin_user)
    env = {**stack_env, "ARTWEB_SWEEP_SECONDS": "1"}
    worker = stack.start_default_worker(env, tmp_path / "logs")
    procs.append(worker)
    stack.wait_for(
        lambda: _alive(client).get(("artweb_workers_alive", ())) == 1,
        timeout=90,
        procs=[worker],
        what="the idle worker counted alive",
    )
    assert _alive(client)[("artweb_workers_alive_by_queue", (("queue", "default"),))] == 1
    assert _alive(client)[("artweb_workers_alive_by_queue", (("queue", "gpu"),))] == 0
    worker.kill()
    stack.wait_for(lambda: _alive(client).get(("artweb_workers_alive", ())) == 0, timeout=15, what="the mark to lapse")
