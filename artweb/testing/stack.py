"""Start the real parts as separate processes against the test database: the ASGI server and Celery
workers. Used by the whole-system tests and the benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from artweb.launcher.embedded import free_port
from artweb.launcher.worker import default_worker_command, gpu_worker_command

REPO = Path(__file__).resolve().parents[2]


def stack_env(*, db_name: str, data_dir: Path, **extra: str) -> dict[str, str]:
    from django.conf import settings

    db = settings.DATABASES["default"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(
        # The caller's (the tests': artweb.testing.settings), so that the processes verify its passwords.
        DJANGO_SETTINGS_MODULE=os.environ.get("DJANGO_SETTINGS_MODULE", "artweb.settings"),
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db_name}",
        REDIS_URL=settings.REDIS_URL,
        ARTWEB_DATA_DIR=str(data_dir),
        ARTWEB_HEARTBEAT_SECONDS="2",
        ARTWEB_VLLM_ENFORCE_EAGER="1",  # no graph compilation: the server starts in well under a minute
        ARTWEB_VLLM_KV_CACHE_GB="1",
        # The same server on every machine, whatever its processor would get (a test names another with
        # the inference_engine marker).
        ARTWEB_INFERENCE_ENGINE="vllm",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    extra: dict = field(default_factory=dict)

    def kill(self, sig=signal.SIGTERM, timeout: float = 30) -> None:
        if self.popen.poll() is not None:
            return
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            return
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=10)

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""


def start(name: str, args: list[str], env: dict, log_dir: Path) -> Proc:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    fh = open(log, "ab")
    popen = subprocess.Popen(args, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    return Proc(name=name, popen=popen, log=log)


def start_gpu_worker(env: dict, log_dir: Path, name: str = "gpu-worker", pool: str = "solo") -> Proc:
    """A GPU worker with the product's command line (artweb.launcher.worker); pool="prefork" starts it as
    the launcher and the Docker image do (one pool child that runs the steps, under a parent that survives
    it), "solo" runs the steps in the worker process itself."""
    command = gpu_worker_command(f"{name}-{free_port()}@%h", pool=pool)
    return start(name, [*command, "--without-gossip", "--without-mingle"], env, log_dir)


def default_worker_command_for_tests(name: str) -> list[str]:
    """A default-queue worker running one task at a time in its own process (pool "solo"), quiet toward
    other workers."""
    return [*default_worker_command(name, concurrency="1", pool="solo"), "--without-gossip", "--without-mingle"]


def start_default_worker(env: dict, log_dir: Path, name: str = "default-worker") -> Proc:
    return start(name, default_worker_command_for_tests(f"{name}-{free_port()}@%h"), env, log_dir)


def start_web(env: dict, log_dir: Path) -> Proc:
    port = free_port()
    proc = start(
        "web",
        [
            sys.executable,
            "-m",
            "uvicorn",
            "artweb.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        env,
        log_dir,
    )
    proc.extra["url"] = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"web server exited:\n{proc.tail()}")
        try:
            if httpx.get(proc.extra["url"] + "/healthz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"web server did not become healthy:\n{proc.tail()}")


def wait_for(predicate, *, timeout: float, interval: float = 1.0, procs: list[Proc] = (), what: str = "condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        for p in procs:
            if p.popen.poll() is not None and p.extra.get("must_live", True):
                raise RuntimeError(f"{p.name} exited while waiting for {what}:\n{p.tail()}")
        time.sleep(interval)
    logs = "\n\n".join(f"--- {p.name} ---\n{p.tail()}" for p in procs)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}\n{logs}")
