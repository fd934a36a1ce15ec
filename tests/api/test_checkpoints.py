"""Checkpoints: list, download as .tar.gz, promote, delete — and bob can do none of it to alice's."""

import io
import tarfile
from pathlib import Path

import pytest

from artweb.testing.factories import CheckpointFactory, RunFactory
from tests.api.conftest import assert_error
from training.models import Checkpoint, Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def checkpoint(alice, tmp_path, settings):
    settings.DATA_DIR = tmp_path / "data"
    run = RunFactory(owner=alice, status=Run.Status.COMPLETED)
    path = tmp_path / "ckpt" / "step-2"
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text('{"r": 8}')
    (path / "adapter_model.safetensors").write_bytes(b"\x01" * 5000)
    return CheckpointFactory(run=run, step=2, path=str(path), size_bytes=5008)


def test_it_lists_a_runs_checkpoints(alice_api, checkpoint):
    body = alice_api.get(f"/api/v1/runs/{checkpoint.run_id}/checkpoints/").json()
    assert [(c["id"], c["step"], c["state"]) for c in body["results"]] == [(checkpoint.id, 2, "active")]


def test_it_downloads_a_checkpoint_as_tar_gz(alice_api, checkpoint):
    response = alice_api.get(f"/api/v1/checkpoints/{checkpoint.id}/download/")
    assert response.status_code == 200 and response["Content-Type"] == "application/gzip"
    data = b"".join(response.streaming_content)
    assert int(response["Content-Length"]) == len(data)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        top = f"run{checkpoint.run_id}-step2"
        assert sorted(tar.getnames()) == [f"{top}/adapter_config.json", f"{top}/adapter_model.safetensors"]


def test_it_promotes_and_deletes(alice_api, checkpoint):
    assert alice_api.post(f"/api/v1/checkpoints/{checkpoint.id}/promote/").json()["promoted"] is True
    body = alice_api.post(f"/api/v1/checkpoints/{checkpoint.id}/delete/").json()
    assert body["state"] == "deleted"
    assert_error(alice_api.get(f"/api/v1/checkpoints/{checkpoint.id}/download/"), 400, contains="deleted")
    assert_error(alice_api.post(f"/api/v1/checkpoints/{checkpoint.id}/promote/"), 400, contains="deleted")


def test_it_refuses_to_delete_the_checkpoint_a_run_resumes_from(alice_api, checkpoint):
    Run.objects.filter(id=checkpoint.run_id).update(status=Run.Status.PAUSED)
    assert_error(alice_api.post(f"/api/v1/checkpoints/{checkpoint.id}/delete/"), 400, contains="resumes")
    assert Checkpoint.objects.get(id=checkpoint.id).state == "active"


def test_bob_cannot_touch_alices_checkpoints(bob_api, checkpoint):
    for method, path in (("get", "download/"), ("post", "promote/"), ("post", "delete/")):
        response = getattr(bob_api, method)(f"/api/v1/checkpoints/{checkpoint.id}/{path}")
        assert_error(response, 404)
    checkpoint.refresh_from_db()
    assert checkpoint.state == "active" and not checkpoint.promoted


def test_first_downloads_at_once_each_get_a_whole_archive_and_it_goes_with_its_checkpoint(
    checkpoint, django_capture_on_commit_callbacks
):
    from concurrent.futures import ThreadPoolExecutor

    from training.services.checkpoints import checkpoint_archive, checkpoint_delete

    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: checkpoint_archive(checkpoint=checkpoint), range(4)))
    assert len(set(paths)) == 1 and paths[0].exists()
    with tarfile.open(paths[0], "r:gz") as tar:
        assert len(tar.getnames()) == 2
    assert [p.name for p in paths[0].parent.iterdir()] == [paths[0].name]  # no temporary file left

    with django_capture_on_commit_callbacks(execute=True):
        checkpoint_delete(checkpoint=checkpoint)
    assert not paths[0].exists() and not Path(checkpoint.path).exists()


def test_abandoned_attempt_directories_are_removed_and_committed_ones_kept(alice, settings, tmp_path):
    import os
    import time

    from training.services.checkpoints import checkpoint_apply_retention

    settings.DATA_DIR = tmp_path / "data"
    run = RunFactory(owner=alice, status=Run.Status.RUNNING, steps_done=1)
    root = tmp_path / "data" / "checkpoints" / f"run-{run.id}"
    committed, abandoned, fresh, staging = (
        root / "step-000001-aaaaaaaa",
        root / "step-000002-bbbbbbbb",
        root / "step-000002-cccccccc",
        root / ".step-000002-dddddddd.tmp-1",
    )
    for path in (committed, abandoned, fresh, staging):
        path.mkdir(parents=True)
        (path / "adapter_model.safetensors").write_bytes(b"x")
    CheckpointFactory(run=run, step=1, path=str(committed))
    old = time.time() - 2 * 3600
    for path in (committed, abandoned, staging):
        os.utime(path, (old, old))
    checkpoint_apply_retention(run=run)
    assert committed.exists() and fresh.exists()  # named by a checkpoint; maybe still being written
    assert not abandoned.exists() and not staging.exists()
