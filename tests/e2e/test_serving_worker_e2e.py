"""A GPU worker started as `make run` and the Docker image start it serves the endpoint: its pool process
(prefork) or the worker itself (solo) runs the serving thread, which says so in Redis. No request is sent,
so no inference server starts."""

from pathlib import Path

import pytest
import redis
from django.conf import settings

from artweb.testing import stack
from training.serving.protocol import ALIVE_KEY

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.mark.parametrize("pool", ["prefork", "solo"])
def test_a_gpu_worker_runs_the_serving_thread(pool, stack_env, procs, tmp_path):
    conn = redis.Redis.from_url(settings.REDIS_URL)
    conn.delete(ALIVE_KEY)
    worker = stack.start_gpu_worker(stack_env, tmp_path / "logs", pool=pool)
    procs.append(worker)

    def serving_pid():
        value = conn.get(ALIVE_KEY)
        return int(value) if value else None

    pid = stack.wait_for(serving_pid, timeout=120, procs=[worker], what="the serving thread")
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    assert b"celery" in cmdline and b"gpu" in cmdline
    assert (pid != worker.popen.pid) == (pool == "prefork")  # prefork: the pool child holds the server
