"""Helpers for the project-wiring tests: a clean environment for subprocesses that import settings."""

import os
import subprocess
import sys

import pytest

from artweb.launcher import BASE_DIR

# Variables that settings read; a subprocess starts without them unless a test sets them.
SETTINGS_VARS = (
    "DEBUG",
    "SECRET_KEY",
    "SECRET_KEY_FALLBACKS",
    "ARTWEB_PLAIN_HTTP",
    "ARTWEB_TRUSTED_PROXIES",
    "DATABASE_URL",
    "REDIS_URL",
    "ARTWEB_DATA_DIR",
    "ALLOWED_HOSTS",
    "CSRF_TRUSTED_ORIGINS",
    "CELERY_BROKER_URL",
    "SECURE_SSL_REDIRECT",
    "ARTWEB_TEST_DB_NAME",
)


@pytest.fixture
def run_python():
    """Run Python code in a fresh interpreter (settings are read once, at import) with the given env."""

    def run(code_or_args, **env):
        base = {k: v for k, v in os.environ.items() if k not in SETTINGS_VARS}
        base.pop("DJANGO_SETTINGS_MODULE", None)
        base.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # a test harness setting, never part of a deployment
        args = ["-c", code_or_args] if isinstance(code_or_args, str) else list(code_or_args)
        return subprocess.run(
            [sys.executable, *args],
            check=False,
            cwd=BASE_DIR,
            env={**base, **env},
            capture_output=True,
            text=True,
            timeout=300,
        )

    return run
