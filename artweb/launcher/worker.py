"""How a GPU worker is started, in one place: its Celery pool, its thread count and the libraries it
preloads. `make run` (the launcher) and the benchmarks (`make bench`, bench/run_curve.py) both start
theirs from here, so a step timed by the benchmark is a step the product runs.

- Pool: prefork with one child (per-task time limits are enforced, and a child killed mid-step is
  replaced), prefetch 1: one run step at a time per GPU set.
- Threads: OMP_NUM_THREADS, the thread count of the trainer's PyTorch (and of vLLM's CPU server, which
  inherits it), is the number of physical cores this worker may use, PyTorch's own default made explicit.
- Preloads (LD_PRELOAD): the libraries vLLM's CPU build asks for "for best performance", where they are
  installed: Intel's OpenMP runtime (libiomp5, installed with the CPU stack) and TCMalloc. They reach the
  trainer and the inference server; never the sandbox, whose environment is built from nothing. With
  libiomp5, KMP_AFFINITY=none: its default pins a forked child (the pool child) to one CPU.

Every setting already in the environment wins; ARTWEB_WORKER_PRELOAD=none turns the preloads off.
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

# Celery options of a GPU worker; `--concurrency 1` and `--prefetch-multiplier 1`: one step at a time.
GPU_WORKER_OPTIONS = (
    "-Q",
    "gpu",
    "--pool",
    "prefork",
    "--concurrency",
    "1",
    "--prefetch-multiplier",
    "1",
    "--loglevel",
    "INFO",
)


# Celery options of a default-queue worker (exports, re-scores, sweeps): several tasks at once.
DEFAULT_WORKER_OPTIONS = ("-Q", "default", "--loglevel", "INFO")


def gpu_worker_command(name: str, *, python: str = sys.executable, pool: str = "prefork") -> list[str]:
    """The command line of a GPU worker called `name` (Celery's -n, e.g. "gpu@%h"). Tests may ask for
    another `pool` ("solo": the task runs in the worker process itself)."""
    options = list(GPU_WORKER_OPTIONS)
    options[options.index("--pool") + 1] = pool
    return [python, "-m", "celery", "-A", "artweb", "worker", *options, "-n", name]


def default_worker_command(
    name: str, *, concurrency: str, python: str = sys.executable, pool: str | None = None
) -> list[str]:
    """The command line of a default-queue worker called `name` running `concurrency` tasks at once (in
    Celery's default pool, or `pool`: tests ask for "solo")."""
    options = (*DEFAULT_WORKER_OPTIONS, "--concurrency", concurrency, *(("--pool", pool) if pool else ()))
    return [python, "-m", "celery", "-A", "artweb", "worker", *options, "-n", name]


def gpu_worker_env(env: dict[str, str], *, prefix: str = sys.prefix) -> dict[str, str]:
    """`env` with the worker's thread count and preloads added (what `env` sets already is kept)."""
    out = dict(env)
    out.setdefault("OMP_NUM_THREADS", str(physical_cores()))
    if env.get("ARTWEB_WORKER_PRELOAD", "auto") != "none":
        present = env.get("LD_PRELOAD", "")
        wanted = [lib for lib in preload_libraries(prefix) if Path(lib).name not in present]
        if wanted:
            out["LD_PRELOAD"] = ":".join([*wanted, *filter(None, [present])])
    if "libiomp5" in out.get("LD_PRELOAD", ""):
        # Intel's OpenMP, once a process has run parallel work, pins every process it forks to one CPU:
        # the pool child that trains, and the inference server that child starts, ran on one core of
        # two (seen with the prefork pool). "none" leaves the placement to the kernel.
        out.setdefault("KMP_AFFINITY", "none")
    return out


def physical_cores() -> int:
    """Physical cores among the CPUs this process may run on (at least 1)."""
    import psutil

    allowed = len(os.sched_getaffinity(0))
    physical = psutil.cpu_count(logical=False) or allowed
    logical = psutil.cpu_count(logical=True) or allowed
    return max(1, allowed * physical // logical)


def preload_libraries(prefix: str = sys.prefix) -> list[str]:
    """TCMalloc and Intel's OpenMP runtime, those of them that are installed (TCMalloc first: an allocator
    must be loaded before anything allocates)."""
    found = []
    tcmalloc = [
        *glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages", "vllm", "libs", "libtcmalloc*.so*")),
        *glob.glob("/usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4"),
        *glob.glob("/usr/lib64/libtcmalloc_minimal.so.4"),
    ]
    if tcmalloc:
        found.append(min(tcmalloc))
    iomp = os.path.join(prefix, "lib", "libiomp5.so")
    if os.path.exists(iomp):
        found.append(iomp)
    return found


def main(argv: list[str]) -> None:
    """`python -m artweb.launcher.worker gpu|default [celery options...]`: become that worker (the
    container start scripts use this), with the GPU worker's environment for `gpu`."""
    if not argv or argv[0] not in ("gpu", "default"):
        sys.exit("usage: python -m artweb.launcher.worker gpu|default [celery options...]")
    role, extra = argv[0], argv[1:]
    env = dict(os.environ)
    if role == "gpu":
        command, env = gpu_worker_command("gpu@%h"), gpu_worker_env(env)
    else:
        command = default_worker_command("default@%h", concurrency=env.get("ARTWEB_WORKER_CONCURRENCY", "2"))
    os.execvpe(command[0], [*command, *extra], env)


if __name__ == "__main__":
    main(sys.argv[1:])
