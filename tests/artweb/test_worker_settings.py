"""The GPU worker's environment (artweb.launcher.worker), as `make run` and `make bench` start it."""

import os
import subprocess
import sys

import pytest

from artweb.launcher.worker import gpu_worker_env, preload_libraries

# Runs parallel work, forks as Celery's prefork pool does, and reports the CPUs the child may use.
FORK_AFTER_OPENMP = """
import os, torch
a = torch.randn(256, 256)
a @ a
pid = os.fork()
if pid == 0:
    b = torch.randn(512, 512)
    b @ b
    print(sorted(os.sched_getaffinity(0)), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_it_sets_threads_and_preloads_but_keeps_what_the_environment_says():
    env = gpu_worker_env({"OMP_NUM_THREADS": "7", "ARTWEB_WORKER_PRELOAD": "none"})
    assert env["OMP_NUM_THREADS"] == "7" and "LD_PRELOAD" not in env and "KMP_AFFINITY" not in env
    env = gpu_worker_env({})
    assert int(env["OMP_NUM_THREADS"]) >= 1


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to see a child pinned to one")
@pytest.mark.skipif(not any("libiomp5" in lib for lib in preload_libraries()), reason="libiomp5 is not installed")
def test_the_pool_child_keeps_every_cpu_of_the_worker():
    """With Intel's OpenMP preloaded and its default affinity, the forked child was pinned to CPU 0."""
    env = gpu_worker_env({k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "KMP_AFFINITY")})
    assert env["KMP_AFFINITY"] == "none"
    child = subprocess.run([sys.executable, "-c", FORK_AFTER_OPENMP], env=env, capture_output=True, text=True)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip() == str(sorted(os.sched_getaffinity(0)))
