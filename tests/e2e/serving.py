"""Fixtures for the serving tests: the session's real vLLM server standing as a GPU worker's inference
server, that worker's serving thread (training.serving.worker) in this process, and the ASGI app in a
subprocess, all on the test database and the test Redis.

The serving thread runs here rather than in a Celery worker process so that it uses the session's vLLM
server (a worker would start a second one: minutes of CPU on this machine); it is the same code the
worker's pool process runs (artweb.celery starts it there).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from artweb.testing.serving import make_served_run
from artweb.testing.web import AsgiServer, database_url

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


@pytest.fixture
def serving_worker(vllm_server, transactional_db):
    """The session's vLLM server as this process's inference server (and in merged mode as the endpoint's
    own second server too), with the serving thread running."""
    from training.services import inference
    from training.serving import worker

    def adopt(base_model) -> None:
        inference._server = vllm_server
        inference._server_model = inference._served_as(base_model)
        if vllm_server.merged:  # such a worker answers on a second server of its own (serving_server): this one
            inference._serving, inference._serving_model = vllm_server, inference._server_model

    worker.serve_loop_start()
    yield adopt
    worker.serve_loop_stop()
    inference._server, inference._server_model = None, None
    inference._serving, inference._serving_model = None, None


@pytest.fixture
def web(transactional_db):
    from django.db import connection

    ARTIFACTS.mkdir(exist_ok=True)
    server = AsgiServer(
        database_url=database_url(connection.settings_dict),
        channel_prefix="artweb-serving-tests",
        broker_url=os.environ.get("ARTWEB_TEST_IDLE_BROKER", "redis://127.0.0.1:6379/15"),
        log_path=ARTIFACTS / "serving-asgi.log",
    ).start()
    yield server
    server.stop()


@pytest.fixture
def served_run(transactional_db, django_user_model, vllm_model_dir, tmp_path):
    """alice with a token and a served run (make_served_run); bob with a token of his own."""
    from rest_framework.authtoken.models import Token

    alice = django_user_model.objects.create_user("alice", "alice@example.com", "alice-pass-123")
    bob = django_user_model.objects.create_user("bob", "bob@example.com", "bob-pass-123")
    model, run, ckpt = make_served_run(alice, vllm_model_dir, tmp_path / "step1")
    return {
        "alice": alice,
        "bob": bob,
        "model": model,
        "run": run,
        "checkpoint": ckpt,
        "alice_token": Token.objects.create(user=alice).key,
        "bob_token": Token.objects.create(user=bob).key,
    }
