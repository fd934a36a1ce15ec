"""The endpoint's own inference server (a merged-mode worker's second server, training.services.serving_server)
computes on ARTWEB_SERVE_THREADS cores and no more: every thread of its processes may run on those cores
alone, and their CPU time, while it generates as fast as it can, stays within them.

Real servers in this process's worker role, each engine in turn (vLLM's CPU build also binds its OpenMP
threads to the cores, CTranslate2 runs that many threads), serving the default model. On two cores, bound to
one the servers used 0.85 (vLLM) and 0.99 (CTranslate2) of a core on this work, unbound 1.87 and 1.5-1.95;
with only vLLM's OpenMP threads bound, 1.3 (its API server and scheduler ran beside them)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import psutil
import pytest

from artweb.testing.factories import BaseModelFactory
from training.services import inference, serving_server

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

ENGINES = [pytest.param("ctranslate2", marks=pytest.mark.ct2), pytest.param("vllm", marks=pytest.mark.vllm)]
CORES = sorted(os.sched_getaffinity(0))


@pytest.fixture
def worker(settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    settings.ARTWEB = {
        **settings.ARTWEB,
        "DEVICE": "cpu",
        "VLLM_PORT": None,
        "VLLM_KV_CACHE_GB": 0.25,
        "VLLM_ENFORCE_EAGER": True,
        "SERVE_SERVER_GB": None,
    }
    yield settings
    inference.shutdown()


def cores_used(server) -> float:
    """CPU seconds per second of the server's processes while it answers 8 samples of 160 tokens (after one
    short request that warms it up)."""
    body = {
        "model": server.base_model_name,
        "messages": [{"role": "user", "content": "Tell me a long story about the sea."}],
        "max_tokens": 160,
        "n": 8,
        "ignore_eos": True,
        "temperature": 1.0,
    }
    post = lambda b: httpx.post(f"{server.base_url}/chat/completions", headers=server.headers, json=b, timeout=600)  # noqa: E731
    assert post({**body, "max_tokens": 4, "n": 1}).status_code == 200
    root = psutil.Process(server._proc.pid)

    def cpu_seconds() -> float:
        total = 0.0
        for proc in [root, *root.children(recursive=True)]:
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                continue
        return total

    before, t0 = cpu_seconds(), time.perf_counter()
    assert post(body).status_code == 200
    return (cpu_seconds() - before) / (time.perf_counter() - t0)


def bound_threads(server) -> set[str]:
    """The cores the server's threads may run on, per thread (each a Cpus_allowed_list), over its processes."""
    found = set()
    for proc in [psutil.Process(server._proc.pid), *psutil.Process(server._proc.pid).children(recursive=True)]:
        for task in Path(f"/proc/{proc.pid}/task").iterdir():
            for line in (task / "status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    found.add(line.split(":", 1)[1].strip())
    return found


@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores: one for the server, one it must leave")
@pytest.mark.parametrize("engine", ENGINES)
def test_the_endpoints_server_computes_on_its_share_of_the_cores(worker, engine, vllm_model_dir):
    worker.ARTWEB = {**worker.ARTWEB, "INFERENCE_ENGINE": engine, "SERVE_THREADS": 1}
    model = BaseModelFactory(name="default", local_path=str(vllm_model_dir))
    assert serving_server.route(model) == serving_server.OWN
    server = serving_server.server(model)
    assert bound_threads(server) == {str(CORES[-1])}  # each thread of each of its processes, the last core alone
    used = cores_used(server)
    assert used < 1.1, used
