"""Dry runs with data attachments: named as a run names them, checked by the same resolver, looked up again
when the worker runs the dry run, and bound read-only at /data/<name> in the real jail.

The policy is the ART·E sandbox test's scripted stand-in (no model here can be relied on to pick the right
tool): its answer can only be right if the script read it from the attached SQLite database. It is handed
to the dry run as the worker's inference server; everything else is real: PostgreSQL, the stored file,
the bubblewrap jail.
"""

from __future__ import annotations

import io

import pytest
from django.urls import reverse

from artweb.errors import ApplicationError
from artweb.testing.factories import (
    BaseModelFactory,
    RewardFunctionVersionFactory,
    RolloutScriptVersionFactory,
    RunFactory,
    ScenarioSetFactory,
)
from rollouts.attachments import attachment_create, attachment_delete
from rollouts.models import DataAttachment
from tests.api.conftest import assert_error, token_client
from tests.rollouts.sandbox.test_attachment_sandbox import ART_E_REWARD, ART_E_SCRIPT, ScriptedMailModel, make_mail_db
from training.models import DryRun, Rescore, Run
from training.services import inference
from training.services.dry_runs import dry_run_create, dry_run_execute

pytestmark = pytest.mark.django_db

QUESTIONS = [
    {"question": "How large is the Q3 budget?", "expected": "48,000 euros"},
    {"question": "Where is the Offsite?", "expected": "Lisbon"},
]


@pytest.fixture(autouse=True)
def data_dir(settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    return settings.DATA_DIR


@pytest.fixture
def enqueued(monkeypatch):
    """The GPU worker's message is recorded instead of sent (the tests run the dry run themselves)."""
    from training import tasks

    calls = []
    monkeypatch.setattr(tasks.dry_run_task, "apply_async", lambda args, kwargs: calls.append(args))
    return calls


@pytest.fixture
def mail(alice, tmp_path):
    """Alice's mail.db, uploaded as an attachment is."""
    make_mail_db(tmp_path / "mail.db")
    with open(tmp_path / "mail.db", "rb") as f:
        return attachment_create(owner=alice, source=f, name="mail.db")[0]


@pytest.fixture
def assets(alice):
    return {
        "script_version": RolloutScriptVersionFactory(asset__owner=alice, asset__name="inbox", content=ART_E_SCRIPT),
        "reward_version": RewardFunctionVersionFactory(asset__owner=alice, asset__name="exact", content=ART_E_REWARD),
        "base_model": BaseModelFactory(),
    }


class MailServer(ScriptedMailModel):
    """The scripted policy as a worker's inference server: the names dry_run_execute reads of one."""

    api_key = None
    started = 0

    def ensure_base(self) -> str:
        return "base"


@pytest.fixture
def server(monkeypatch):
    with MailServer() as model:

        def inference_server(base_model, run=None):
            model.started += 1
            return model

        monkeypatch.setattr(inference, "inference_server", inference_server)
        monkeypatch.setattr(inference, "vocab_size", lambda base_model: None)
        yield model


def test_a_dry_run_reads_its_attachment_at_data_in_the_jail(
    alice, assets, mail, server, enqueued, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        dry = dry_run_create(owner=alice, scenarios=QUESTIONS, samples=2, attachments=["mail.db"], **assets)
    assert enqueued == [(dry.id,)] and DryRun.objects.get().attachments == ["mail.db"]

    dry_run_execute(dry_run_id=dry.id)

    dry.refresh_from_db()
    assert dry.status == "done", dry.error
    trajectories = dry.result["trajectories"]
    assert [t["error"] for t in trajectories] == [None] * 4
    assert dry.result["rewards"] == [1.0] * 4
    for t in trajectories:
        expected = QUESTIONS[t["scenario_index"]]["expected"]
        tool_turns = [m for m in t["messages"] if m["role"] == "tool"]
        assert len(tool_turns) == 1 and expected in tool_turns[0]["content"]  # what it read from /data/mail.db
    assert len(server.requests) == 2 * 4  # a tool call and an answer per rollout


def test_without_the_attachment_the_same_dry_run_reads_nothing(alice, assets, mail, server, enqueued):
    """The control: the same script and policy, the attachment not named, so /data holds nothing."""
    dry = dry_run_create(owner=alice, scenarios=QUESTIONS[:1], **assets)
    dry_run_execute(dry_run_id=dry.id)
    dry.refresh_from_db()
    assert dry.status == "done" and dry.result["rewards"] == [None]
    assert "unable to open database file" in dry.result["errors"][0]


def test_an_attachment_deleted_after_the_dry_run_was_queued_fails_it_naming_it(alice, assets, mail, server, enqueued):
    dry = dry_run_create(owner=alice, scenarios=QUESTIONS[:1], attachments=["mail.db"], **assets)
    DataAttachment.objects.filter(id=mail.id).delete()  # past the delete guard, as an operator's delete is

    dry_run_execute(dry_run_id=dry.id)

    dry.refresh_from_db()
    assert dry.status == "failed"
    assert "The data attachment 'mail.db' that this dry run names was deleted after it was queued" in dry.error
    assert "Upload it again under the same name" in dry.error
    assert server.started == 0  # refused before the inference server was asked for


def test_a_dry_run_names_only_its_owners_own_attachments(alice, bob, assets, enqueued):
    attachment_create(owner=bob, source=io.BytesIO(b"bob's data"), name="bob.db")
    for names, words in [
        (["bob.db"], "You have no data attachment named 'bob.db'"),
        (["../etc/passwd"], "is not a file name an attachment can have"),
        (["a.db", "a.db"], "named twice"),
        ([f"f{i}.db" for i in range(21)], "at most 20"),
        ("mail.db", "valid list"),
    ]:
        with pytest.raises(ApplicationError) as caught:
            dry_run_create(owner=alice, scenarios=QUESTIONS, attachments=names, **assets)
        assert words in caught.value.message and list(caught.value.field_errors) == ["attachments"], names
    assert not DryRun.objects.exists() and enqueued == []


def test_the_api_takes_attachments_and_refuses_another_users(alice, bob, assets, mail, enqueued, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "EXCEPTION_HANDLER": "artweb.api_errors.exception_handler"}
    attachment_create(owner=bob, source=io.BytesIO(b"bob's data"), name="bob.db")
    api = token_client(alice)
    body = {"script": "inbox", "reward": "exact", "base_model": assets["base_model"].id, "scenarios": QUESTIONS}
    created = api.post("/api/v1/dry-runs/create/", {**body, "attachments": ["mail.db"]}, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["attachments"] == ["mail.db"]
    assert api.get(f"/api/v1/dry-runs/{created.json()['id']}/").json()["attachments"] == ["mail.db"]

    refused = api.post("/api/v1/dry-runs/create/", {**body, "attachments": ["bob.db"]}, format="json")
    error = assert_error(refused, 400, field="attachments", contains="no data attachment named 'bob.db'")
    assert error["field_errors"]["attachments"] == ["bob.db: no such attachment of yours"]
    bad = api.post("/api/v1/dry-runs/create/", {**body, "attachments": "mail.db"}, format="json")
    assert_error(bad, 400, field="attachments")
    assert DryRun.objects.count() == 1


def test_the_form_ticks_attachments_and_a_link_prefills_them(client, alice, bob, assets, mail, enqueued):
    attachment_create(owner=bob, source=io.BytesIO(b"bob's data"), name="bob.db")
    set_ = ScenarioSetFactory(owner=alice, name="questions")
    client.force_login(alice)
    page = client.get(reverse("dry-run-new") + "?attachments=mail.db").content.decode()
    assert 'name="attachments" value="mail.db"' in page and "bob.db" not in page  # her own only
    assert 'value="mail.db" id="id_attachments_0" checked' in page  # ticked by the launch page's link

    form = {
        "script_version": assets["script_version"].id,
        "reward_version": assets["reward_version"].id,
        "base_model": assets["base_model"].id,
        "scenario_set": set_.id,
        "samples": 1,
    }
    assert client.post(reverse("dry-run-new"), {**form, "attachments": "bob.db"}).status_code == 400
    response = client.post(reverse("dry-run-new"), {**form, "attachments": "mail.db"})
    dry = DryRun.objects.get()
    assert response["Location"] == reverse("dry-run-detail", args=[dry.id]) and dry.attachments == ["mail.db"]
    assert "<code>/data/mail.db</code>" in client.get(response["Location"]).content.decode()


def test_without_attachments_the_form_shows_no_attachment_field(client, alice):
    client.force_login(alice)
    assert 'name="attachments"' not in client.get(reverse("dry-run-new")).content.decode()


def test_delete_is_refused_while_a_dry_run_or_rescore_under_way_names_it(alice, assets, mail, enqueued):
    dry = dry_run_create(owner=alice, scenarios=QUESTIONS[:1], attachments=["mail.db"], **assets)
    with pytest.raises(ApplicationError, match=f"'mail.db' is used by the dry run #{dry.id}, which is not finished"):
        attachment_delete(attachment=mail, actor=alice)
    DryRun.objects.filter(id=dry.id).update(status="done")

    run = RunFactory(owner=alice, name="inbox-run", status=Run.Status.COMPLETED, config={"attachments": ["mail.db"]})
    rescore = Rescore.objects.create(owner=alice, run=run, reward_version=assets["reward_version"])  # queued
    with pytest.raises(ApplicationError, match=f"used by the re-score #{rescore.id} of the run 'inbox-run'"):
        attachment_delete(attachment=mail, actor=alice)
    Rescore.objects.filter(id=rescore.id).update(status="failed")

    attachment_delete(attachment=mail, actor=alice)  # the run is finished, nothing else under way
    assert not DataAttachment.objects.exists()
