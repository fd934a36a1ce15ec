"""The web side of a whole-system test: the ASGI app (HTTP + WebSockets) under uvicorn in a subprocess,
against a given database, and the headless Chromium that opens its pages.

pytest-django's live_server is WSGI only, so the pages' WebSockets need this instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from artweb.launcher.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("ARTWEB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class AsgiServer:
    def __init__(
        self, *, database_url: str, channel_prefix: str, broker_url: str, log_path: Path | None = None, egress_allow=""
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "ARTWEB_CHANNEL_PREFIX": channel_prefix,
            # A broker database no worker reads: launched runs stay queued, the test plays the worker.
            "CELERY_BROKER_URL": broker_url,
            "DB_CONN_MAX_AGE": "0",
            "DEBUG": "true",
            "PYTHONPATH": str(ROOT),
            # host:port of local servers standing in for external ones, allowed as an operator would.
            "ARTWEB_EGRESS_ALLOW": egress_allow,
        }
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.log = None

    def start(self, timeout: float = 60.0) -> AsgiServer:
        self.log = open(self.log_path, "wb") if self.log_path else None
        log = self.log or subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "artweb.testing.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                "--ws",
                "websockets",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the ASGI server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(self.url + "/accounts/login/", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the ASGI server did not answer within {timeout} s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log:
            self.log.close()


def database_url(settings_dict: dict) -> str:
    user = settings_dict.get("USER") or "postgres"
    password = f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else ""
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{settings_dict['NAME']}"
