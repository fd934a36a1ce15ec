"""Registering a base model checks its files as a worker will load them: a Hub id in the local Hugging Face
cache (no network), or a server directory; config, tokenizer, weights, and their size against memory.

The models are real files: the default model's, laid out in a Hugging Face cache under a temporary HF_HOME
(the `hub` fixture) as huggingface_hub lays one out (artweb.testing.model_cache)."""

import json
import os
import shutil
import struct
from pathlib import Path

import psutil
import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from artweb.errors import ApplicationError
from artweb.testing.model_cache import DEFAULT_REPO_ID, TOKENIZER, cache_model, model_files
from training.models import PretrainedModel
from training.services import base_model_register, inference
from training.services.base_models import base_model_check
from training.services.model_files import GIB, WEIGHT_COPIES, model_files_check

pytestmark = pytest.mark.django_db

REPO_ID = DEFAULT_REPO_ID


def refused(source: str, *, owner=None, field: str = "source") -> ApplicationError:
    with pytest.raises(ApplicationError) as exc:
        base_model_register(owner=owner, name="m", source=source)
    assert field in exc.value.field_errors
    assert not PretrainedModel.objects.filter(name="m").exists()
    return exc.value


def assert_no_host_path(error: ApplicationError, *paths: Path) -> None:
    text = json.dumps(error.as_dict())
    for path in paths:
        assert str(path) not in text and str(path.resolve()) not in text


def test_it_registers_a_model_of_the_local_cache(alice, hub, vllm_model_dir):
    snapshot = cache_model(hub, REPO_ID, model_files(vllm_model_dir))
    model = base_model_register(owner=alice, name="smol", source=REPO_ID)
    assert model.source == REPO_ID and model.local_path == ""
    # What the check found is where the worker's path leads, and the weights' real size.
    found = model_files_check(inference.base_model_path(model))
    assert found.directory == snapshot.resolve()
    assert found.architecture == "LlamaForCausalLM"
    assert found.weight_files == ("model.safetensors",)
    assert found.weight_bytes == (vllm_model_dir / "model.safetensors").stat().st_size


def test_a_model_missing_from_the_cache_is_refused_with_what_to_do(alice, hub):
    error = refused("org/absent", owner=alice)
    assert "not in this server's model cache" in error.message and "hf download org/absent" in error.message
    assert error.field_errors == {"source": ["not in this server's model cache"]}
    assert_no_host_path(error, hub)


def test_a_model_without_weights_is_refused(alice, hub, vllm_model_dir):
    cache_model(hub, REPO_ID, model_files(vllm_model_dir, weights=False))
    error = refused(REPO_ID, owner=alice)
    assert error.field_errors == {"source": ["no weights (.safetensors or .bin) found"]}
    assert REPO_ID in error.message
    assert_no_host_path(error, hub, vllm_model_dir)


def test_a_weight_file_whose_blob_is_gone_is_missing(alice, hub, vllm_model_dir):
    snapshot = cache_model(hub, REPO_ID, model_files(vllm_model_dir))
    (snapshot / os.readlink(snapshot / "model.safetensors")).unlink()  # the blob; the snapshot's link stays
    error = refused(REPO_ID, owner=alice)
    assert "missing 1 of its 1 weight files (model.safetensors)" in error.message
    assert error.field_errors == {"source": ["weights incomplete"]}


def test_a_shard_the_index_names_is_missing(alice, hub, vllm_model_dir):
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = json.dumps({"metadata": {}, "weight_map": {"a.weight": shards[0], "b.weight": shards[1]}}).encode()
    files = {**model_files(vllm_model_dir, weights=False), "model.safetensors.index.json": index}
    cache_model(hub, REPO_ID, {**files, shards[0]: vllm_model_dir / "model.safetensors"})
    error = refused(REPO_ID, owner=alice)
    assert f"missing 1 of its 2 weight files ({shards[1]})" in error.message


def test_a_cut_off_weight_file_is_refused(alice, hub, vllm_model_dir):
    with open(vllm_model_dir / "model.safetensors", "rb") as weights:
        head = weights.read(1 << 20)
    cache_model(hub, REPO_ID, {**model_files(vllm_model_dir, weights=False), "model.safetensors": head})
    error = refused(REPO_ID, owner=alice)
    assert "model.safetensors" in error.message and "damaged or incomplete" in error.message
    assert error.field_errors == {"source": ["weights damaged"]}
    assert_no_host_path(error, hub)


def test_a_model_that_is_not_a_causal_lm_is_refused(alice, hub, vllm_model_dir):
    config = json.dumps({"architectures": ["BertForMaskedLM"], "model_type": "bert"}).encode()
    cache_model(hub, REPO_ID, {**model_files(vllm_model_dir), "config.json": config})
    error = refused(REPO_ID, owner=alice)
    assert "names the architecture BertForMaskedLM, which is not a causal language model" in error.message


def test_a_model_that_needs_its_own_code_is_refused_without_running_it(alice, hub, vllm_model_dir, tmp_path):
    ran = tmp_path / "ran"
    code = f"open({str(ran)!r}, 'w').write('ran')\n".encode()
    config = json.dumps({"model_type": "tiny_custom", "auto_map": {"AutoConfig": "configuration_tiny.TinyConfig"}})
    files = {**model_files(vllm_model_dir), "config.json": config.encode(), "configuration_tiny.py": code}
    cache_model(hub, REPO_ID, files)
    error = refused(REPO_ID, owner=alice)
    assert "needs its own Python code" in error.message
    assert not ran.exists()


def test_a_model_without_a_tokenizer_is_refused(alice, hub, vllm_model_dir):
    cache_model(hub, REPO_ID, model_files(vllm_model_dir, tokenizer=False))
    error = refused(REPO_ID, owner=alice)
    assert error.field_errors == {"source": ["no loadable tokenizer"]}
    assert_no_host_path(error, hub, vllm_model_dir)


def sparse_weights(path: Path, size: int) -> Path:
    """A safetensors file of one float32 tensor of at least `size` bytes; sparse, so it takes no disk."""
    floats = -(-size // 4)
    header = json.dumps({"w": {"dtype": "F32", "shape": [floats], "data_offsets": [0, 4 * floats]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as weights:
        weights.write(struct.pack("<Q", len(header)) + header)
        weights.truncate(8 + len(header) + 4 * floats)
    return path


def test_weights_the_workers_cannot_hold_are_refused(alice, hub, vllm_model_dir, tmp_path, settings):
    """On a CPU a worker holds the weights WEIGHT_COPIES times; these are just over what this machine's
    memory holds that many times."""
    settings.ARTWEB = {**settings.ARTWEB, "DEVICE": "cpu"}
    memory = psutil.virtual_memory().total
    big = sparse_weights(tmp_path / "big.safetensors", memory // WEIGHT_COPIES + 1)
    cache_model(hub, REPO_ID, {**model_files(vllm_model_dir, weights=False), "model.safetensors": big})
    error = refused(REPO_ID, owner=alice)
    assert f"are {big.stat().st_size / GIB:.1f} GiB; a worker holds them {WEIGHT_COPIES} times" in error.message
    assert f"the workers have {memory / GIB:.1f} GiB of memory" in error.message
    assert error.field_errors == {"source": ["too large for the workers' memory"]}


def test_on_a_gpu_the_machine_only_has_to_load_the_weights(alice, hub, vllm_model_dir, tmp_path, settings):
    settings.ARTWEB = {**settings.ARTWEB, "DEVICE": "cuda"}
    memory = psutil.virtual_memory().total
    half = sparse_weights(tmp_path / "half.safetensors", memory // WEIGHT_COPIES + 1)
    cache_model(hub, REPO_ID, {**model_files(vllm_model_dir, weights=False), "model.safetensors": half})
    assert base_model_register(owner=alice, name="big", source=REPO_ID).source == REPO_ID
    whole = sparse_weights(tmp_path / "whole.safetensors", memory + 1)
    cache_model(hub, "org/bigger", {**model_files(vllm_model_dir, weights=False), "model.safetensors": whole})
    error = refused("org/bigger", owner=alice)
    assert "holds them" not in error.message and f"have {memory / GIB:.1f} GiB of memory" in error.message


def test_staff_register_a_server_directory_that_holds_a_whole_model(staff, vllm_model_dir):
    model = base_model_register(owner=staff, name="local", source=str(vllm_model_dir))
    assert model.local_path == str(vllm_model_dir)


def test_a_server_directory_is_checked_without_showing_its_path(staff, vllm_model_dir, tmp_path):
    incomplete = tmp_path / "incomplete"
    incomplete.mkdir()
    for name in ("config.json", *TOKENIZER):
        shutil.copy(vllm_model_dir / name, incomplete / name)
    error = refused(str(incomplete), owner=staff)
    assert error.message.startswith("The model directory has no weights")
    assert_no_host_path(error, incomplete)
    error = refused(str(tmp_path / "nowhere"), owner=staff)
    assert error.field_errors == {"source": ["not a model directory"]}
    assert_no_host_path(error, tmp_path)


def test_registering_an_existing_model_again_does_not_need_its_files(alice, hub, vllm_model_dir):
    snapshot = cache_model(hub, REPO_ID, model_files(vllm_model_dir))
    first = base_model_register(owner=alice, name="smol", source=REPO_ID)
    shutil.rmtree(snapshot)
    assert base_model_register(owner=alice, name="smol", source=REPO_ID) == first
    refused(REPO_ID, owner=alice)  # a new name is a new registration, checked


def test_the_admin_and_the_api_apply_the_same_checks(alice, staff, hub):
    """The admin's form calls base_model_check; the API calls the registration service."""
    with pytest.raises(ApplicationError, match="not in this server's model cache"):
        base_model_check(name="m", source="org/absent", actor=staff)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=alice).key}")
    response = api.post("/api/v1/base-models/register/", {"name": "m", "source": "org/absent"}, format="json")
    assert response.status_code == 400
    assert response.json()["field_errors"] == {"source": ["not in this server's model cache"]}
    assert str(hub) not in response.content.decode()
