"""A worker asked for a model it cannot serve keeps what it has: a model whose files are broken is refused
before the running server stops; a server that fails to start is stopped and not kept, and the model is
refused at once, with the same reason, until START_RETRY_SECONDS have passed.

The servers are real: artweb's CTranslate2 server (the quicker start) serving the default model, and vLLM
refusing the default model's files with a max length longer than the model's."""

import tempfile
import time

import httpx
import psutil
import pytest

from artweb.errors import ApplicationError
from artweb.testing.factories import BaseModelFactory
from artweb.testing.model_cache import link_model
from rollouts.inference.inference_server import InferenceServerError
from training.services import inference

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


@pytest.fixture
def worker(settings, tmp_path, monkeypatch):
    """A CPU worker with its own data and temporary directories (where servers keep their work dirs)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(inference, "_start_failures", {})
    settings.DATA_DIR = tmp_path / "data"
    settings.ARTWEB = {
        **settings.ARTWEB,
        "DEVICE": "cpu",
        "VLLM_PORT": None,
        "VLLM_KV_CACHE_GB": 0.25,
        "VLLM_ENFORCE_EAGER": True,
    }
    yield settings
    inference.shutdown()


def engine(settings, name: str) -> None:
    settings.ARTWEB = {**settings.ARTWEB, "INFERENCE_ENGINE": name}


def without_weights(model_dir):
    (model_dir / "model.safetensors").unlink()
    return model_dir


@pytest.mark.ct2
def test_a_model_with_broken_files_leaves_the_running_server_serving(worker, vllm_model_dir, tmp_path):
    engine(worker, "ctranslate2")
    default = BaseModelFactory(name="default", local_path=str(vllm_model_dir))
    server = inference.inference_server(default)
    broken = BaseModelFactory(
        name="broken", local_path=str(without_weights(link_model(vllm_model_dir, tmp_path / "b")))
    )
    with pytest.raises(ApplicationError, match="The model directory has no weights"):
        inference.inference_server(broken)
    assert inference._server is server and httpx.get(f"{server.root_url}/health").status_code == 200
    assert inference.inference_server(default) is server


@pytest.mark.vllm
def test_a_failed_start_keeps_no_server_and_is_refused_at_once_until_its_retry(
    worker, vllm_model_dir, tmp_path, monkeypatch
):
    engine(worker, "vllm")
    model_dir = link_model(vllm_model_dir, tmp_path / "m")
    too_long = BaseModelFactory(name="too-long", local_path=str(model_dir), max_length=100_000)
    children = set(psutil.Process().children(recursive=True))
    with pytest.raises(InferenceServerError) as first:
        inference.inference_server(too_long)
    assert "max_model_len (100000)" in str(first.value) and "Lower the base model's max length" in str(first.value)
    assert inference._server is None and not inference.server_died()  # nothing dead kept to restart
    assert set(psutil.Process().children(recursive=True)) <= children  # vLLM's processes are gone
    assert not list(tmp_path.glob("artweb-inference-*"))  # and its work directory

    started = time.monotonic()
    with pytest.raises(InferenceServerError) as again:
        inference.inference_server(too_long)
    assert time.monotonic() - started < 1
    assert str(again.value) == f"{first.value} (This start failed on this worker; it is tried again in about 5 min.)"

    # Only that start is refused: the same files with a max length they support go on to be checked (and,
    # their weights gone now, are refused for that), as does the first model once its time has passed.
    without_weights(model_dir)
    fixed = BaseModelFactory(name="fixed", local_path=str(model_dir), max_length=2048)
    with pytest.raises(ApplicationError, match="has no weights"):
        inference.inference_server(fixed)
    with pytest.raises(InferenceServerError, match="tried again in about"):
        inference.inference_server(too_long)
    monkeypatch.setattr(inference, "START_RETRY_SECONDS", 0)
    with pytest.raises(ApplicationError, match="has no weights"):
        inference.inference_server(too_long)
