"""Settings come from the environment; each case imports them in a fresh interpreter."""

import json
import os
import secrets
import stat

import pytest

from artweb.launcher import launch_env

DUMP = """
import json
from artweb import settings
db = settings.DATABASES["default"]
print(json.dumps({
    "db": [db["NAME"], db["HOST"], db["PORT"], db["USER"], db["PASSWORD"]], "test_db": db["TEST"]["NAME"],
    "redis": settings.REDIS_URL, "cache": settings.CACHES["default"]["LOCATION"],
    "channels": settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"], "broker": settings.CELERY_BROKER_URL,
    "debug": settings.DEBUG, "data_dir": str(settings.DATA_DIR), "media": str(settings.MEDIA_ROOT), "hosts": settings.ALLOWED_HOSTS,
    "secret": settings.SECRET_KEY, "static": settings.STORAGES["staticfiles"]["BACKEND"],
    "ssl_redirect": getattr(settings, "SECURE_SSL_REDIRECT", None),
    "session_secure": getattr(settings, "SESSION_COOKIE_SECURE", None), "plain_http": settings.ARTWEB_PLAIN_HTTP,
    "fallbacks": settings.SECRET_KEY_FALLBACKS,
}))
"""


@pytest.fixture
def settings_from(run_python):
    def read(**env):
        proc = run_python(DUMP, **env)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    return read


def production_env(**extra):
    return {"DEBUG": "false", "SECRET_KEY": secrets.token_urlsafe(50), "ALLOWED_HOSTS": "artweb.example.com", **extra}


def test_it_reads_database_and_redis_urls(settings_from):
    s = settings_from(DATABASE_URL="postgres://art:pw@db.internal:5433/prod", REDIS_URL="redis://cache:6380/2")
    assert s["db"] == ["prod", "db.internal", 5433, "art", "pw"]
    assert s["redis"] == s["cache"] == s["broker"] == "redis://cache:6380/2"
    assert [h["address"] for h in s["channels"]] == ["redis://cache:6380/2"]


def test_it_defaults_to_local_services_and_debug_off(settings_from, tmp_path):
    s = settings_from(ARTWEB_DATA_DIR=str(tmp_path))
    assert s["debug"] is False
    assert s["db"][:3] == ["artweb", "127.0.0.1", 5432]
    assert s["redis"] == "redis://127.0.0.1:6379/0"
    # Loopback names only: plain HTTP, so a fresh checkout signs in over http://127.0.0.1.
    assert s["plain_http"] is True and s["ssl_redirect"] is False and s["session_secure"] is False
    assert settings_from(ARTWEB_DATA_DIR=str(tmp_path), DEBUG="true")["debug"] is True


def test_it_keeps_a_random_secret_key_in_the_data_dir(settings_from, tmp_path):
    """No built-in key: the first process makes one (0600, never readable by others), the next ones use
    it, and an explicit SECRET_KEY wins."""
    first = settings_from(ARTWEB_DATA_DIR=str(tmp_path))["secret"]
    key_file = tmp_path / "secret_key"
    assert key_file.read_text().strip() == first and len(first) >= 50
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name != "secret_key"]  # no temporary file left behind
    assert settings_from(ARTWEB_DATA_DIR=str(tmp_path))["secret"] == first
    assert settings_from(ARTWEB_DATA_DIR=str(tmp_path / "other"))["secret"] != first
    s = settings_from(ARTWEB_DATA_DIR=str(tmp_path), SECRET_KEY="k" * 50, SECRET_KEY_FALLBACKS=f"{first},old")
    assert s["secret"] == "k" * 50 and s["fallbacks"] == [first, "old"]


def test_it_makes_the_key_file_private_whatever_the_umask(tmp_path):
    from artweb.bootstrap import secret_key_load_or_create

    old = os.umask(0)
    try:
        key = secret_key_load_or_create(tmp_path / "fresh")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "fresh" / "secret_key").stat().st_mode) == 0o600
    assert secret_key_load_or_create(tmp_path / "fresh") == key


def test_it_reads_the_data_dir_hosts_and_test_database(settings_from, tmp_path):
    s = settings_from(
        ARTWEB_DATA_DIR=str(tmp_path),
        ALLOWED_HOSTS="a.example,b.example",
        ARTWEB_TEST_DB_NAME="test_other",
        CELERY_BROKER_URL="redis://broker:6379/5",
    )
    assert s["data_dir"] == str(tmp_path.resolve())
    assert s["media"] == str(tmp_path.resolve() / "uploads")
    assert s["hosts"] == ["a.example", "b.example"]
    assert s["test_db"] == "test_other"
    assert s["broker"] == "redis://broker:6379/5"


def test_it_hardens_production(settings_from):
    s = settings_from(**production_env())
    assert s["debug"] is False
    assert s["ssl_redirect"] is True and s["session_secure"] is True and s["plain_http"] is False
    assert s["static"] == "artweb.staticfiles.CollectedStaticFilesStorage"


def test_it_refuses_an_unusable_key_file_naming_secret_key(run_python, tmp_path):
    (tmp_path / "secret_key").write_text("")
    proc = run_python(["manage.py", "check"], ARTWEB_DATA_DIR=str(tmp_path))
    assert proc.returncode != 0
    assert "SECRET_KEY is not set, and the key file" in proc.stderr and "is empty" in proc.stderr


def test_it_passes_check_deploy_in_production(run_python):
    proc = run_python(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], **production_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no issues (0 silenced)" in proc.stdout + proc.stderr


HTTPS_ONLY_CHECKS = ("security.W004", "security.W008", "security.W012", "security.W016")


def test_it_passes_check_deploy_under_the_launchers_defaults(run_python, tmp_path):
    """`make run`'s environment (DEBUG unset, the data dir's key, loopback names): clean, the four HTTPS-only
    checks (HSTS, SSL redirect, Secure session and CSRF cookies) silenced, as they cannot apply to plain
    HTTP on 127.0.0.1."""
    env = launch_env({"ARTWEB_DATA_DIR": str(tmp_path)}, tmp_path, host="127.0.0.1")
    assert env["ALLOWED_HOSTS"] == "localhost,127.0.0.1,[::1]" and "DEBUG" not in env
    proc = run_python(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no issues (4 silenced)" in proc.stdout + proc.stderr


def test_check_deploy_still_warns_of_plain_http_under_a_public_name(run_python, tmp_path):
    proc = run_python(
        ["manage.py", "check", "--deploy"],
        ARTWEB_DATA_DIR=str(tmp_path),
        ALLOWED_HOSTS="artweb.example.com",
        ARTWEB_PLAIN_HTTP="true",
    )
    out = proc.stdout + proc.stderr
    assert all(check in out for check in HTTPS_ONLY_CHECKS), out
