"""Settings come from the environment; each case imports them in a fresh interpreter."""

import json
import secrets

import pytest

DUMP = """
import json
from artweb import settings as s
db = s.DATABASES["default"]
print(json.dumps({
    "db": [db["NAME"], db["HOST"], db["PORT"], db["USER"], db["PASSWORD"]], "test_db": db["TEST"]["NAME"],
    "redis": s.REDIS_URL, "cache": s.CACHES["default"]["LOCATION"],
    "channels": s.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"], "broker": s.CELERY_BROKER_URL,
    "debug": s.DEBUG, "data_dir": str(s.DATA_DIR), "media": str(s.MEDIA_ROOT), "hosts": s.ALLOWED_HOSTS,
    "secret": s.SECRET_KEY, "static": s.STORAGES["staticfiles"]["BACKEND"],
    "ssl_redirect": getattr(s, "SECURE_SSL_REDIRECT", None),
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


def test_it_defaults_to_local_services_in_development(settings_from):
    s = settings_from()
    assert s["debug"] is True
    assert s["db"][:3] == ["artweb", "127.0.0.1", 5432]
    assert s["redis"] == "redis://127.0.0.1:6379/0"
    assert s["secret"]  # a development key, so a fresh checkout starts without configuration


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
    assert s["ssl_redirect"] is True
    assert s["static"] == "whitenoise.storage.CompressedManifestStaticFilesStorage"


def test_it_refuses_production_without_a_secret_key(run_python):
    proc = run_python(["manage.py", "check"], DEBUG="false")
    assert proc.returncode != 0
    assert "SECRET_KEY is not set" in proc.stderr


def test_it_passes_check_deploy_in_production(run_python):
    proc = run_python(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], **production_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no issues (0 silenced)" in proc.stdout + proc.stderr
