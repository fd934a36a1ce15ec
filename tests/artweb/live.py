"""The web server as `make run` starts it (the launcher's environment and uvicorn command line), on the
test database, in its own process: what a hostile client on this machine talks to.

The environment is artweb.launcher.launch_env's (DEBUG unset, loopback host names) and the command
artweb.launcher.web_command's, with this test process's database, SECRET_KEY (sessions made here hold
there) and a REDIS_URL carrying a password, which no page may show.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
from django.conf import settings

from artweb.launcher import BASE_DIR, launch_env, web_command
from artweb.launcher.embedded import free_port
from artweb.testing.web import database_url
from tests.artweb.conftest import SETTINGS_VARS

# Redis accepts any password for its passwordless default user; the server sends this one with every
# connection, so it is in the settings every page could leak.
REDIS_PASSWORD = "r3dis-pa55word-never-shown"


class LiveServer:
    def __init__(self, data_dir: Path, *, app: str | None = None, **extra_env: str):
        from django.db import connection

        base = {k: v for k, v in os.environ.items() if k not in SETTINGS_VARS and not k.startswith("PYTEST")}
        base.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        redis_db = settings.REDIS_URL.rsplit("/", 1)[-1]
        env = {
            **base,
            "ARTWEB_DATA_DIR": str(data_dir),
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_URL": f"redis://default:{REDIS_PASSWORD}@127.0.0.1:6379/{redis_db}",
            "SECRET_KEY": settings.SECRET_KEY,
            "DB_CONN_MAX_AGE": "0",
            "PYTHONPATH": str(BASE_DIR),
            **extra_env,
        }
        self.env = launch_env(env, data_dir, host="127.0.0.1")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = web_command(self.env, host="127.0.0.1", port=self.port)
        if app:  # the same command serving another application module
            self.command[self.command.index("artweb.asgi:application")] = app
        self.log = data_dir / "web.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90.0) -> LiveServer:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.command, cwd=BASE_DIR, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the web server exited with {self.proc.returncode}:\n{self.output(4000)}")
            try:
                httpx.get(self.url + "/healthz", timeout=2)
                return self
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the web server did not answer within {timeout} s:\n{self.output(4000)}")

    def output(self, tail: int | None = None) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text[-tail:] if tail else text

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
