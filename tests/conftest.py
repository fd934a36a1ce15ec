"""Shared fixtures: personas (alice, bob, staff), row factories, and the session-wide vLLM server."""

import importlib.util

import pytest

pytest_plugins = ["tests.fixtures.vllm"] if importlib.util.find_spec("tests.fixtures.vllm") else []


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
    import os
    from pathlib import Path

    from training.engine.default_model import ensure_default_model

    data_dir = Path(os.environ.get("ARTWEB_DATA_DIR", Path(__file__).resolve().parents[1] / "data"))
    return ensure_default_model(data_dir).path.resolve()
