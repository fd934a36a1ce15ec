"""Data attachments through the API, the services and the pages: upload, dedupe, names, size limit, quota,
visibility, deletes a run blocks, a run that names them, and the request size the upload route allows."""

from __future__ import annotations

import hashlib
import io

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from artweb.request_size import ATTACHMENT_UPLOAD_PATHS, _limit_mb
from artweb.testing.factories import RunFactory
from rollouts.attachments import attachment_create, attachment_delete
from rollouts.models import DataAttachment
from rollouts.selectors import attachment_file, attachments_resolve
from tests.api.conftest import assert_error
from training.models import Quota, Run

MB = 1 << 20


@pytest.fixture(autouse=True)
def data_dir(settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    return settings.DATA_DIR


@pytest.fixture
def enqueued(monkeypatch):
    from training import tasks

    calls = []
    monkeypatch.setattr(tasks.run_step_task, "apply_async", lambda args, kwargs: calls.append((args, kwargs)))
    return calls


def upload(api, content: bytes, name: str = "", filename: str = "mail.db"):
    data = {"file": SimpleUploadedFile(filename, content), "description": "inbox"}
    if name:
        data["name"] = name
    return api.post("/api/v1/attachments/create/", data, format="multipart")


def test_it_stores_an_upload_once_by_its_hash_read_only(alice_api, bob_api, alice, bob, data_dir):
    content = b"SQLite format 3\0" + b"x" * 5000
    response = upload(alice_api, content)
    assert response.status_code == 201, response.content
    body = response.json()
    sha = hashlib.sha256(content).hexdigest()
    assert (body["name"], body["path"], body["size"], body["sha256"]) == ("mail.db", "/data/mail.db", len(content), sha)
    stored = data_dir / "attachments" / sha
    assert stored.read_bytes() == content and stored.stat().st_mode & 0o777 == 0o444
    # The same file under the same name again: the same attachment (200). Bob's copy: his row, the same file.
    again = upload(alice_api, content)
    assert again.status_code == 200 and again.json()["id"] == body["id"]
    assert upload(bob_api, content, name="inbox.db").status_code == 201
    assert sorted(p.name for p in (data_dir / "attachments").iterdir()) == [sha]  # no leftover temporary file
    assert DataAttachment.objects.filter(sha256=sha).count() == 2


def test_other_content_under_a_taken_name_is_refused(alice_api):
    assert upload(alice_api, b"first").status_code == 201
    assert_error(upload(alice_api, b"other"), 400, field="name", contains="already have an attachment named 'mail.db'")
    assert_error(upload(alice_api, b"other!"), 400, field="name", contains="another name")  # same size or not


@pytest.mark.parametrize("name", ["../etc/passwd", ".hidden", "a/b", "with space", "x" * 101, "a..b"])
def test_a_name_that_is_not_a_plain_file_name_is_refused(alice_api, name):
    assert_error(upload(alice_api, b"data", name=name), 400, field="name")
    assert not DataAttachment.objects.exists()


def test_a_file_over_the_limit_is_refused_and_nothing_is_kept(alice, alice_api, settings, data_dir):
    settings.ARTWEB_ATTACHMENT_MAX_MB = 1
    assert_error(upload(alice_api, b"x" * (MB + 1)), 400, field="file", contains="ARTWEB_ATTACHMENT_MAX_MB")
    # A source whose size is not known beforehand is cut off as it is read.
    with pytest.raises(Exception, match="ARTWEB_ATTACHMENT_MAX_MB"):
        attachment_create(owner=alice, source=io.BytesIO(b"x" * (MB + 1)), name="big.bin")
    assert not DataAttachment.objects.exists()
    assert list((data_dir / "attachments").iterdir()) == []


def test_an_upload_past_the_quota_is_refused_with_the_usage_and_the_limit(alice, alice_api):
    Quota.objects.create(user=alice, attachment_mb=1)
    assert upload(alice_api, b"x" * (MB // 2), name="a.bin").status_code == 201
    body = assert_error(upload(alice_api, b"y" * (MB // 2 + 1), name="b.bin"), 400, field="quota")
    assert "attachment quota of 1.0\xa0MB (your own quota; 512.0\xa0KB used)" in body["message"]
    # Content someone already stored still counts in full for a new owner.
    with pytest.raises(Exception, match="attachment quota"):
        attachment_create(owner=alice, source=io.BytesIO(b"x" * (MB // 2 + 1)), name="c.bin")
    assert list(DataAttachment.objects.values_list("name", flat=True)) == ["a.bin"]


def test_each_user_lists_and_gets_their_own(alice_api, bob_api, staff):
    mine = upload(alice_api, b"alice's").json()
    assert [a["name"] for a in bob_api.get("/api/v1/attachments/").json()["results"]] == []
    assert bob_api.get(f"/api/v1/attachments/{mine['id']}/").status_code == 404
    assert bob_api.post(f"/api/v1/attachments/{mine['id']}/delete/").status_code == 404
    assert alice_api.get("/api/v1/attachments/?name=mail.db").json()["count"] == 1


def test_a_run_names_only_its_owners_attachments(alice, bob, alice_api, alice_assets, enqueued):
    attachment_create(owner=bob, source=io.BytesIO(b"bob's"), name="bob.db")
    attachment_create(owner=alice, source=io.BytesIO(b"alice's"), name="mail.db")
    run = {
        "name": "r",
        "base_model": alice_assets["base_model"].name,
        "script": "alice-script",
        "reward": "alice-reward",
        "scenario_set": "alice-scenarios",
    }
    refused = alice_api.post("/api/v1/runs/create/", {**run, "config": {"attachments": ["bob.db"]}}, format="json")
    assert_error(refused, 400, field="attachments", contains="no data attachment named 'bob.db'")
    bad = alice_api.post("/api/v1/runs/create/", {**run, "config": {"attachments": ["../x"]}}, format="json")
    assert_error(bad, 400, field="attachments", contains="not a file name")
    made = alice_api.post("/api/v1/runs/create/", {**run, "config": {"attachments": ["mail.db"]}}, format="json")
    assert made.status_code == 201, made.content
    assert Run.objects.get(owner=alice).config["attachments"] == ["mail.db"]
    with pytest.raises(Exception, match="no data attachment named 'bob.db'"):
        attachments_resolve(owner=alice, names=["mail.db", "bob.db"])


def test_delete_is_refused_while_an_unfinished_run_names_it(alice, alice_api, data_dir):
    a = upload(alice_api, b"inbox").json()
    RunFactory(owner=alice, name="training-now", status=Run.Status.PAUSED, config={"attachments": ["mail.db"]})
    RunFactory(owner=alice, name="done", status=Run.Status.COMPLETED, config={"attachments": ["mail.db"]})
    refused = alice_api.post(f"/api/v1/attachments/{a['id']}/delete/")
    assert_error(refused, 400, field="attachment", contains="used by the run 'training-now'")
    Run.objects.filter(name="training-now").update(status=Run.Status.CANCELLED)
    assert alice_api.post(f"/api/v1/attachments/{a['id']}/delete/").status_code == 204
    assert not DataAttachment.objects.exists() and list((data_dir / "attachments").iterdir()) == []


def test_the_stored_file_stays_while_another_attachment_has_the_same_content(alice, bob):
    mine, _ = attachment_create(owner=alice, source=io.BytesIO(b"shared"), name="a.db")
    theirs, _ = attachment_create(owner=bob, source=io.BytesIO(b"shared"), name="b.db")
    attachment_delete(attachment=mine, actor=alice)
    assert attachment_file(theirs).read_bytes() == b"shared"
    with pytest.raises(Exception, match="not yours"):
        attachment_delete(attachment=theirs, actor=alice)


def test_the_upload_routes_take_bodies_up_to_the_attachment_limit_and_no_other_does(settings):
    settings.ARTWEB_ATTACHMENT_MAX_MB, settings.ARTWEB_MAX_REQUEST_MB = 2048, 32
    assert set(ATTACHMENT_UPLOAD_PATHS) == {reverse("api-attachment-create"), reverse("attachment-new")}
    for path in ATTACHMENT_UPLOAD_PATHS:
        assert _limit_mb(path) == (2049, "ARTWEB_ATTACHMENT_MAX_MB")
    for path in ("/api/v1/scenario-sets/create/", "/api/v1/attachments/", "/attachments/new/x"):
        assert _limit_mb(path) == (32, "ARTWEB_MAX_REQUEST_MB")


def test_the_page_uploads_lists_and_deletes(as_user, alice, bob):
    client = as_user(alice)
    response = client.post(reverse("attachment-new"), {"file": SimpleUploadedFile("mail.db", b"inbox"), "name": ""})
    assert response.status_code == 302
    page = client.get(reverse("attachment-list")).content.decode()
    assert "/data/mail.db" in page and "mail.db uploaded" in page
    refused = client.post(reverse("attachment-new"), {"file": SimpleUploadedFile("x", b"x"), "name": "../x"})
    assert "is not a file name an attachment can have" in refused.content.decode()
    a = DataAttachment.objects.get()
    assert as_user(bob).post(reverse("attachment-delete", args=[a.id])).status_code == 404
    client = as_user(alice)
    client.post(reverse("attachment-delete", args=[a.id]))
    assert not DataAttachment.objects.exists()


def test_the_launch_form_offers_the_users_own_attachments(as_user, alice, bob, alice_assets, enqueued):
    attachment_create(owner=alice, source=io.BytesIO(b"alice's"), name="mail.db")
    attachment_create(owner=bob, source=io.BytesIO(b"bob's"), name="bob.db")
    page = as_user(alice).get(reverse("run-launch")).content.decode()
    assert 'value="mail.db"' in page and "bob.db" not in page
    a = alice_assets
    response = as_user(alice).post(
        reverse("run-launch"),
        {
            "base_model": a["base_model"].id,
            "script_version": a["script"].id,
            "reward_version": a["reward"].id,
            "scenario_set": a["scenario_set"].id,
            "attachments": ["mail.db"],
        },
    )
    assert response.status_code == 302, response.content.decode()[-3000:]
    assert Run.objects.get(owner=alice).config["attachments"] == ["mail.db"]
