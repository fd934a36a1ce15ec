"""Fixtures for the serving tests: the session's real vLLM server standing as a GPU worker's inference
server, that worker's serving thread (training.services.serving) in this process, and the ASGI app in a
subprocess, all on the test database and the test Redis.

The serving thread runs here rather than in a Celery worker process so that it uses the session's vLLM
server (a worker would start a second one: minutes of CPU on this machine); it is the same code the
worker's pool process runs (artweb.celery starts it there).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.browser.server import AsgiServer, database_url

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


@pytest.fixture
def serving_worker(vllm_server, transactional_db):
    """The session's vLLM server as this process's inference server, with the serving thread running."""
    from training.services import inference, serving

    def adopt(base_model) -> None:
        inference._server = vllm_server
        inference._server_model = inference._served_as(base_model)

    serving.serve_loop_start()
    yield adopt
    serving.serve_loop_stop()
    inference._server, inference._server_model = None, None


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


def make_served_run(owner, model_dir, adapter_dir: Path):
    """The default model registered (shared), and a finished run of owner's with a real LoRA checkpoint at
    step 1 (a random adapter saved by PEFT, as the trainer saves one): (model, run, checkpoint)."""
    from tests.factories import RunFactory
    from tests.rollouts.runtime.adapters import make_adapter
    from training.models import Checkpoint, PretrainedModel
    from training.services import base_model_register

    model = PretrainedModel.objects.filter(name="SmolLM2-135M-Instruct").first() or base_model_register(
        name="SmolLM2-135M-Instruct", source=str(model_dir), local_path=str(model_dir), supports_tools=True
    )
    run = RunFactory(owner=owner, base_model=model, status="completed", num_steps=1, steps_done=1)
    adapter = make_adapter(adapter_dir, seed=7, std=0.05)
    return model, run, Checkpoint.objects.create(run=run, step=1, path=str(adapter), val_reward=0.5)


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
