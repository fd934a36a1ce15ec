"""The GPU worker's environment (artweb.launcher.worker), as `make run` and `make bench` start it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from artweb.launcher.worker import gpu_worker_env, preload_libraries

ROOT = Path(__file__).resolve().parents[2]

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


def test_the_worker_command_lines_are_written_once():
    """The launcher, the container start scripts and the benchmarks take the workers' command lines from
    artweb.launcher.worker; no other file spells out a worker's Celery options."""
    for script in ("docker/start-gpu-worker", "docker/start-worker"):
        text = (ROOT / script).read_text()
        assert "exec python -m artweb.launcher.worker" in text and "celery " not in text, script
    spelled = sorted(
        str(path.relative_to(ROOT))
        for folder in ("artweb", "training", "rollouts", "bench", "docker")
        for path in (ROOT / folder).rglob("*")
        if path.is_file() and path.suffix in ("", ".py", ".sh", ".yml")
        if "prefetch-multiplier" in path.read_text(errors="replace")
    )
    assert spelled == ["artweb/launcher/worker.py"]


@pytest.mark.parametrize("role", ["gpu", "default"])
def test_the_worker_entry_point_becomes_that_worker(role):
    """`python -m artweb.launcher.worker ROLE --help` execs Celery's worker with that role's options; its
    `--help` prints and exits without a broker."""
    proc = subprocess.run(
        [sys.executable, "-m", "artweb.launcher.worker", role, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--prefetch-multiplier" in proc.stdout  # the help text of Celery's worker command


def test_the_worker_entry_point_names_the_roles_it_knows():
    proc = subprocess.run(
        [sys.executable, "-m", "artweb.launcher.worker", "gpus"], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode != 0 and "gpu|default" in proc.stderr
