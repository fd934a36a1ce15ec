"""artweb started as `make run` starts it, for a test that uses the product as a new user does.

`python -m artweb.launcher run` in a subprocess, in an environment without the test session's settings
(no DATABASE_URL, REDIS_URL or broker, no test settings module, no SECRET_KEY): the launcher starts its
embedded PostgreSQL and Redis under a fresh data dir, prepares it, creates the admin, and prints the
address and the admin's password, which are read from its output. Stopped as a person stops it: Ctrl-C
(SIGINT), then a wait while it stops its children and servers.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from artweb.launcher.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
# What a test session sets that a fresh machine has not: the product would run on the tests' database,
# broker, settings module or secret instead of its own.
DROPPED = {
    "DATABASE_URL",
    "REDIS_URL",
    "SECRET_KEY",
    "SECRET_KEY_FALLBACKS",
    "DEBUG",
    "ALLOWED_HOSTS",
    "CSRF_TRUSTED_ORIGINS",
    "DB_CONN_MAX_AGE",
    "LOG_FORMAT",
    "LOG_LEVEL",
    "HF_HUB_OFFLINE",
    "SECURE_SSL_REDIRECT",
    "SECURE_HSTS_SECONDS",
}
DROPPED_PREFIXES = ("ARTWEB_", "DJANGO_", "CELERY_", "PYTEST_")
URL_LINE = re.compile(r"^artweb is running at (http://\S+)$")
PASSWORD_LINE = re.compile(r"^Log in as '([^']+)' with password '([^']+)'\.$")
SERVICE_LINE = re.compile(r"^artweb: started embedded (\w+) at \S+@127\.0\.0\.1:(\d+)/")
STOP_WAIT_S = 90  # the launcher gives its children 20 s, then stops PostgreSQL and Redis


def fresh_machine_env(environ: dict, data_dir: Path, **extra: str) -> dict:
    """The environment of a shell on a machine where artweb was never configured, with data_dir as its
    data dir and `extra` set (ports a test picks so that parallel sessions do not collide)."""
    env = {k: v for k, v in environ.items() if k not in DROPPED and not k.startswith(DROPPED_PREFIXES)}
    return {**env, "ARTWEB_DATA_DIR": str(data_dir), **extra}


class Launched:
    """One `python -m artweb.launcher run`, its output kept in log_path and read for the banner."""

    def __init__(self, data_dir: Path, log_path: Path):
        self.data_dir = data_dir
        self.log_path = log_path
        self.web_port = free_port()
        self.vllm_port = free_port()
        self.env = fresh_machine_env(
            os.environ, data_dir, ARTWEB_PORT=str(self.web_port), ARTWEB_VLLM_PORT=str(self.vllm_port)
        )
        self.lines: list[str] = []
        self.url: str | None = None
        self.username: str | None = None
        self.password: str | None = None
        self.service_ports: dict[str, int] = {}
        self.proc: subprocess.Popen | None = None
        self._banner = threading.Event()
        self._reader: threading.Thread | None = None

    def start(self, timeout: float) -> Launched:
        """Start it and wait until it has printed its address and the new admin's password."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "artweb.launcher", "run"],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # Ctrl-C in this test's terminal is the test's, not the product's
        )
        self._reader = threading.Thread(target=self._read, name="launcher-output", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not self._banner.wait(0.5):
            if self.proc.poll() is not None:
                self._reader.join(5)
                raise RuntimeError(f"the launcher exited with {self.proc.returncode} before it was up:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the launcher printed no address within {timeout:g} s:\n{self.tail()}")
        return self

    def _read(self) -> None:
        with open(self.log_path, "w") as log:
            for raw in self.proc.stdout:
                line = raw.rstrip("\n")
                log.write(raw)
                log.flush()
                self.lines.append(line)
                if match := SERVICE_LINE.match(line):
                    self.service_ports[match[1]] = int(match[2])
                elif match := URL_LINE.match(line):
                    self.url = match[1]
                elif match := PASSWORD_LINE.match(line):
                    self.username, self.password = match[1], match[2]
                    self._banner.set()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.lines[-lines:])

    def stop(self) -> int:
        """Ctrl-C, then wait for it to stop everything; kill its process group only if it hangs. Returns
        its exit status (0 when it was never started)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self._reader:
            self._reader.join(10)
        return self.proc.returncode

    def stop_leftovers(self) -> str:
        """`python -m artweb.launcher stop` on the same data dir: stops embedded servers a dead launcher
        left running, and says so. Its output (empty when nothing was left)."""
        out = subprocess.run(
            [sys.executable, "-m", "artweb.launcher", "stop"],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return (out.stdout + out.stderr).strip()

    def ports_in_use(self, wait_s: float = 15.0) -> list[str]:
        """The ports it served on where something still listens after wait_s: web, inference server,
        PostgreSQL, Redis (a refused connection is a closed port; TIME_WAIT sockets do not count)."""
        ports = {"web": self.web_port, "inference server": self.vllm_port, **self.service_ports}
        deadline = time.monotonic() + wait_s
        while True:
            busy = [f"{name} ({port})" for name, port in ports.items() if _listening(port)]
            if not busy or time.monotonic() > deadline:
                return busy
            time.sleep(0.5)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True
