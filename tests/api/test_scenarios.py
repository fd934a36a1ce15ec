"""Scenario sets: JSONL upload (JSON text or a file), list, detail, scenarios by page; bad files."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from artweb.testing.factories import ScenarioSetFactory
from rollouts.models import Scenario, ScenarioSet
from tests.api.conftest import assert_error

pytestmark = pytest.mark.django_db

JSONL = (
    "\n".join(
        json.dumps({"prompt": f"p{i}", "answer": f"a{i}", **({"split": "validation"} if i >= 8 else {})})
        for i in range(10)
    )
    + "\n"
)


def test_it_uploads_a_file(alice_api, alice):
    response = alice_api.post(
        "/api/v1/scenario-sets/create/",
        {"name": "questions", "validation_fraction": "0", "file": SimpleUploadedFile("q.jsonl", JSONL.encode())},
        format="multipart",
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["train_count"], body["validation_count"]) == (8, 2)
    assert ScenarioSet.objects.get(id=body["id"]).owner == alice


def test_it_uploads_json_text_and_pages_scenarios(alice_api):
    body = alice_api.post(
        "/api/v1/scenario-sets/create/", {"name": "q", "jsonl": JSONL, "validation_fraction": 0}, format="json"
    ).json()
    page = alice_api.get(f"/api/v1/scenario-sets/{body['id']}/scenarios/?limit=3&offset=3").json()
    assert page["count"] == 10 and [s["index"] for s in page["results"]] == [3, 4, 5]
    assert page["results"][0]["data"]["prompt"] == "p3"
    validation = alice_api.get(f"/api/v1/scenario-sets/{body['id']}/scenarios/?split=validation").json()
    assert [s["index"] for s in validation["results"]] == [8, 9]
    listed = alice_api.get("/api/v1/scenario-sets/?name=q").json()["results"]
    assert [s["id"] for s in listed] == [body["id"]]
    assert alice_api.get(f"/api/v1/scenario-sets/{body['id']}/").json()["train_count"] == 8


@pytest.mark.parametrize(
    "content, field, contains",
    [
        (b'{"prompt": "ok"}\n{"prompt": \n', "file", "line 2"),
        (b"[1, 2]\n", "file", "JSON object"),
        (b"\xff\xfe\x00binary", "file", None),
        (b'{"prompt": "caf\xe9"}\n', "content", "UTF-8"),
        (b'{"prompt": "a\\u0000b"}\n', "file", "NUL"),
        (b"\n\n", "file", "no scenarios"),
        (b'{"split": "validation"}\n', "file", "no training"),
    ],
)
def test_it_rejects_bad_files_and_writes_nothing(alice_api, content, field, contains):
    response = alice_api.post(
        "/api/v1/scenario-sets/create/",
        {"name": "bad", "file": SimpleUploadedFile("bad.jsonl", content)},
        format="multipart",
    )
    assert_error(response, 400, field=field, contains=contains)
    assert not ScenarioSet.objects.exists() and not Scenario.objects.exists()


def test_it_rejects_an_oversized_file(alice_api, monkeypatch):
    from rollouts.apis import scenarios

    monkeypatch.setattr(scenarios, "MAX_SCENARIO_BYTES", 100)
    response = alice_api.post(
        "/api/v1/scenario-sets/create/",
        {"name": "big", "file": SimpleUploadedFile("big.jsonl", JSONL.encode())},
        format="multipart",
    )
    assert_error(response, 413, contains="limit")
    assert not ScenarioSet.objects.exists()


def test_it_rejects_a_duplicate_name_and_a_bad_fraction(alice_api, alice):
    ScenarioSetFactory(owner=alice, name="taken")
    assert_error(
        alice_api.post("/api/v1/scenario-sets/create/", {"name": "taken", "jsonl": JSONL}, format="json"),
        400,
        field="name",
    )
    assert_error(
        alice_api.post(
            "/api/v1/scenario-sets/create/", {"name": "new", "jsonl": JSONL, "validation_fraction": 1.5}, format="json"
        ),
        400,
        field="validation_fraction",
    )
    assert_error(
        alice_api.post("/api/v1/scenario-sets/create/", {"name": "new", "jsonl": 5}, format="json"), 400, field="jsonl"
    )
    assert_error(alice_api.post("/api/v1/scenario-sets/create/", {"name": "new"}, format="json"), 400, field="file")
    assert ScenarioSet.objects.count() == 1


def test_bob_cannot_see_alices_scenarios(bob_api, alice):
    theirs = ScenarioSetFactory(owner=alice, name="alice-only")
    assert_error(bob_api.get(f"/api/v1/scenario-sets/{theirs.id}/"), 404)
    assert_error(bob_api.get(f"/api/v1/scenario-sets/{theirs.id}/scenarios/"), 404)
    assert bob_api.get("/api/v1/scenario-sets/").json()["count"] == 0
