"""/api/v1/export-targets/: create, list, show, change, test and delete; only one's own; the key is
write-only."""

import json

import pytest

from artweb.launcher.embedded import free_port
from artweb.testing.factories import RunFactory
from tests.api.conftest import assert_error
from tests.egress import egress_allow
from tests.exports.conftest import start_recording_server
from training.exports.selectors import export_target_secret
from training.exports.services import export_target_create
from training.models import ExportTarget

KEY = "wandbkey-0123456789abcdefghij-WXYZ"


@pytest.fixture
def recording_server(settings):
    """A local endpoint answering like Langfuse's ingestion API (see tests/exports/conftest.py)."""
    rec = start_recording_server()
    egress_allow(settings, rec.url)
    yield rec
    rec.stop()


def create(api, **payload):
    return api.post("/api/v1/export-targets/create/", payload, format="json")


def test_it_creates_lists_shows_and_never_returns_the_key(alice_api, alice):
    response = create(alice_api, kind="wandb", settings={"project": "my-agent", "trajectories_per_step": 4}, secret=KEY)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["kind"] == "wandb" and body["run"] is None and body["enabled"] is True
    assert body["settings"]["project"] == "my-agent" and body["settings"]["trajectories_per_step"] == 4
    assert body["settings"]["mode"] == "online"  # defaults filled in by the schema
    assert body["secret"] == "••••WXYZ" and body["secret_source"] == "stored"

    listed = alice_api.get("/api/v1/export-targets/")
    shown = alice_api.get(f"/api/v1/export-targets/{body['id']}/")
    for text in (response.content, listed.content, shown.content):
        assert b"0123456789" not in text and KEY.encode() not in text
    assert [t["id"] for t in listed.json()["results"]] == [body["id"]]
    assert shown.json() == body
    assert export_target_secret(ExportTarget.objects.get(id=body["id"])) == KEY


def test_it_creates_a_target_for_one_run_and_filters_by_run(alice_api, alice):
    run, other = RunFactory(owner=alice), RunFactory(owner=alice)
    create(alice_api, kind="langfuse", settings={"public_key": "pk"}, secret="sk-lf-1", run=run.id)
    create(alice_api, kind="langfuse", settings={"public_key": "pk"}, secret="sk-lf-2")
    results = alice_api.get(f"/api/v1/export-targets/?run={run.id}").json()["results"]
    assert [(t["kind"], t["run"]) for t in results] == [("langfuse", run.id)]
    assert alice_api.get(f"/api/v1/export-targets/?run={other.id}").json()["results"] == []
    assert len(alice_api.get("/api/v1/export-targets/").json()["results"]) == 2


@pytest.mark.parametrize(
    "payload, field, says",
    [
        ({"kind": "wandb", "settings": {}}, "settings.project", "required"),
        ({"kind": "wandb", "settings": {"project": "has spaces"}}, "settings.project", "use letters, digits"),
        ({"kind": "weave", "settings": {"project": "no-entity"}}, "settings.project", "entity/project"),
        (
            {"kind": "wandb", "settings": {"project": "p", "trajectories_per_step": 999}},
            "settings.trajectories_per_step",
            "less than or equal to 256",
        ),
        (
            {"kind": "wandb", "settings": {"project": "p", "mode": "sometimes"}},
            "settings.mode",
            "'online' or 'offline'",
        ),
        ({"kind": "langfuse", "settings": {"host": "ftp://x"}}, "settings.host", "http:// or https://"),
        ({"kind": "langfuse", "settings": {"secret_key": "sk"}}, "settings.secret_key", "the settings are host"),
        ({"kind": "datadog"}, "kind", None),
        ({"kind": "wandb", "settings": {"project": "p"}, "run": 987654}, "run", "no run 987654 among yours"),
    ],
)
def test_it_says_which_field_is_wrong_and_what_to_enter(alice_api, payload, field, says):
    body = assert_error(create(alice_api, **payload), 400, field=field)
    if says:
        assert says.lower() in json.dumps(body).lower(), body
    assert ExportTarget.objects.count() == 0


def test_it_refuses_a_second_target_of_a_kind_for_the_same_scope(alice_api):
    assert create(alice_api, kind="wandb", settings={"project": "a"}).status_code == 201
    assert_error(
        create(alice_api, kind="wandb", settings={"project": "b"}),
        400,
        field="kind",
        contains="already a Weights & Biases export for your runs",
    )


def test_editing_without_a_key_keeps_the_stored_one(alice_api, alice):
    target_id = create(alice_api, kind="wandb", settings={"project": "p"}, secret=KEY).json()["id"]
    url = f"/api/v1/export-targets/{target_id}/update/"

    changed = alice_api.post(url, {"settings": {"project": "q", "entity": "team"}, "enabled": False}, format="json")
    assert changed.status_code == 200, changed.json()
    assert changed.json()["settings"]["project"] == "q" and changed.json()["enabled"] is False
    assert changed.json()["secret"] == "••••WXYZ"
    assert export_target_secret(ExportTarget.objects.get(id=target_id)) == KEY

    replaced = alice_api.post(url, {"secret": "another-key-4444-ABCD"}, format="json").json()
    assert replaced["secret"] == "••••ABCD" and replaced["settings"]["project"] == "q"
    cleared = alice_api.post(url, {"secret": ""}, format="json").json()
    assert cleared["secret"] == "" and cleared["secret_source"] == "none"

    assert_error(alice_api.post(url, {"settings": {"project": ""}}, format="json"), 400, field="settings.project")


def test_another_user_gets_404_for_every_operation(alice, bob_api):
    target = export_target_create(owner=alice, kind="wandb", settings={"project": "p"}, secret=KEY)
    base = f"/api/v1/export-targets/{target.id}/"
    assert_error(bob_api.get(base), 404)
    for action, payload in (("update/", {"enabled": False}), ("test/", None), ("delete/", None)):
        assert_error(bob_api.post(base + action, payload, format="json"), 404)
    assert bob_api.get("/api/v1/export-targets/").json()["results"] == []
    assert_error(
        create(bob_api, kind="wandb", settings={"project": "p"}, run=RunFactory(owner=alice).id), 400, field="run"
    )
    target.refresh_from_db()
    assert target.enabled and ExportTarget.objects.filter(id=target.id).exists()


def test_staff_too_see_only_their_own_here(alice, staff_api):
    """Everyone's are in the admin; the API is about one's own."""
    target = export_target_create(owner=alice, kind="wandb", settings={"project": "p"})
    assert_error(staff_api.get(f"/api/v1/export-targets/{target.id}/"), 404)


def test_it_needs_a_token(anon_api):
    assert_error(anon_api.get("/api/v1/export-targets/"), 401)
    assert_error(create(anon_api, kind="wandb", settings={"project": "p"}), 401)


def test_the_test_action_answers_with_the_services_message(alice_api, recording_server, settings):
    target_id = create(
        alice_api,
        kind="langfuse",
        secret="sk-lf-secret-1234",
        settings={"host": recording_server.url, "public_key": "pk-lf"},
    ).json()["id"]
    ok = alice_api.post(f"/api/v1/export-targets/{target_id}/test/")
    assert ok.status_code == 200
    assert ok.json()["ok"] is True and "accepted a test trace" in ok.json()["message"]
    assert ok.json()["target"]["last_success_at"]
    assert len(recording_server.requests) == 1

    dead = egress_allow(settings, f"http://127.0.0.1:{free_port()}")
    alice_api.post(
        f"/api/v1/export-targets/{target_id}/update/",
        {"settings": {"host": dead, "public_key": "pk-lf"}},
        format="json",
    )
    failed = alice_api.post(f"/api/v1/export-targets/{target_id}/test/").json()
    assert failed["ok"] is False and failed["message"].startswith(f"Langfuse at {dead} is unreachable")
    assert failed["target"]["last_error"] == f"Test event: {failed['message']}"
    assert "sk-lf-secret-1234" not in json.dumps(failed)


def test_it_deletes(alice_api, alice):
    target_id = create(alice_api, kind="weave", settings={"project": "team/agents"}, secret=KEY).json()["id"]
    response = alice_api.post(f"/api/v1/export-targets/{target_id}/delete/")
    assert response.status_code == 200 and response.json() == {"deleted": target_id}
    assert not ExportTarget.objects.filter(id=target_id).exists()
    assert_error(alice_api.get(f"/api/v1/export-targets/{target_id}/"), 404)


def test_it_describes_each_kinds_settings(alice_api):
    kinds = {k["kind"]: k for k in alice_api.get("/api/v1/export-targets/kinds/").json()["results"]}
    assert set(kinds) == {"wandb", "weave", "langfuse"}
    wandb = kinds["wandb"]["settings_schema"]
    assert wandb["required"] == ["project"]
    assert wandb["properties"]["trajectories_per_step"]["maximum"] == 256
