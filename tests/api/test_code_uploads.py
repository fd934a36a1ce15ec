"""Rollout scripts and reward functions: upload as JSON text or a file, versions, validate-only, and
bad uploads (syntax errors, oversized, non-UTF-8, binary) answered with a 4xx and nothing saved."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from artweb.testing.factories import REWARD, SCRIPT
from rollouts.models import RewardFunction, RewardFunctionVersion, RolloutScript, RolloutScriptVersion
from tests.api.conftest import assert_error

pytestmark = pytest.mark.django_db

BROKEN = "import art\n\nasync def rollout(model, scenario)\n    return None\n"


def py(content: str | bytes, name="rollout.py"):
    return SimpleUploadedFile(name, content.encode() if isinstance(content, str) else content, "text/x-python")


def test_it_uploads_a_script_as_json_then_adds_versions(alice_api, alice):
    response = alice_api.post("/api/v1/scripts/create/", {"name": "agent", "content": SCRIPT}, format="json")
    assert response.status_code == 201, response.json()
    v1 = response.json()
    assert v1["number"] == 1 and v1["name"] == "agent"
    script = RolloutScript.objects.get(id=v1["asset_id"])
    assert script.owner == alice and script.versions.get().content == SCRIPT

    v2 = alice_api.post(
        f"/api/v1/scripts/{script.id}/versions/create/",
        {"note": "louder", "file": py(SCRIPT + "\n# v2\n")},
        format="multipart",
    ).json()
    assert v2["number"] == 2 and v2["note"] == "louder"
    same = alice_api.post(f"/api/v1/scripts/{script.id}/versions/create/", {"content": SCRIPT}, format="json").json()
    assert same["number"] == 1  # identical content is the existing version

    listed = alice_api.get(f"/api/v1/scripts/{script.id}/versions/").json()
    assert [v["number"] for v in listed["results"]] == [2, 1]
    detail = alice_api.get(f"/api/v1/scripts/{script.id}/versions/1/").json()
    assert detail["content"] == SCRIPT
    assert alice_api.get(f"/api/v1/scripts/{script.id}/").json()["latest_version"] == 2
    assert [s["name"] for s in alice_api.get("/api/v1/scripts/?name=agent").json()["results"]] == ["agent"]
    assert_error(alice_api.get(f"/api/v1/scripts/{script.id}/versions/9/"), 404)


def test_it_uploads_a_reward_file_and_detects_its_kind(alice_api):
    response = alice_api.post(
        "/api/v1/rewards/create/", {"name": "exact", "file": py(REWARD, "reward.py")}, format="multipart"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["kind"] == "trajectory"
    reward_id = body["asset_id"]
    assert alice_api.get(f"/api/v1/rewards/{reward_id}/versions/1/").json()["content"] == REWARD
    assert alice_api.get(f"/api/v1/rewards/{reward_id}/versions/").json()["count"] == 1
    assert alice_api.get("/api/v1/rewards/").json()["results"][0]["name"] == "exact"


@pytest.mark.parametrize("kind", ["scripts", "rewards"])
def test_it_validates_without_saving(alice_api, kind):
    good = SCRIPT if kind == "scripts" else REWARD
    ok = alice_api.post(f"/api/v1/{kind}/validate/", {"content": good}, format="json").json()
    assert ok["valid"] is True and ok["issues"] == []
    bad = alice_api.post(f"/api/v1/{kind}/validate/", {"file": py(BROKEN)}, format="multipart").json()
    assert bad["valid"] is False and bad["issues"][0]["line"] == 3 and bad["issues"][0]["message"]
    assert not RolloutScript.objects.exists() and not RewardFunction.objects.exists()


@pytest.mark.parametrize("kind", ["scripts", "rewards"])
def test_it_rejects_a_script_that_does_not_validate(alice_api, kind):
    body = assert_error(
        alice_api.post(f"/api/v1/{kind}/create/", {"name": "x", "content": BROKEN}, format="json"), 400, field="content"
    )
    assert "line 3" in body["message"]
    assert not RolloutScript.objects.exists() and not RewardFunction.objects.exists()


@pytest.mark.parametrize("kind", ["scripts", "rewards"])
def test_it_rejects_non_utf8_binary_and_oversized_files(alice_api, kind):
    url = f"/api/v1/{kind}/create/"
    assert_error(
        alice_api.post(url, {"name": "x", "file": py(b"# caf\xe9\n")}, format="multipart"), 400, contains="UTF-8"
    )
    assert_error(
        alice_api.post(url, {"name": "x", "file": py(b"\x7fELF\x00\x00")}, format="multipart"), 400, contains="binary"
    )
    assert_error(
        alice_api.post(url, {"name": "x", "file": py("#" * (1024 * 1024 + 1))}, format="multipart"),
        413,
        contains="limit",
    )
    assert_error(alice_api.post(url, {"name": "x", "content": "#" * (1024 * 1024 + 1)}, format="json"), 413)
    assert_error(alice_api.post(url, {"name": "x"}, format="json"), 400, field="file")
    assert_error(alice_api.post(url, {"name": "x", "content": 12}, format="json"), 400, field="content")
    assert_error(alice_api.post(url, {"content": SCRIPT}, format="json"), 400, field="name")
    assert not RolloutScriptVersion.objects.exists() and not RewardFunctionVersion.objects.exists()


def test_it_rejects_a_second_script_of_the_same_name(alice_api):
    assert (
        alice_api.post("/api/v1/scripts/create/", {"name": "agent", "content": SCRIPT}, format="json").status_code
        == 201
    )
    body = assert_error(
        alice_api.post("/api/v1/scripts/create/", {"name": "agent", "content": SCRIPT + "#"}, format="json"),
        400,
        field="name",
    )
    assert "new version" in body["message"]
    assert RolloutScriptVersion.objects.count() == 1


def test_bob_cannot_read_or_extend_alices_code(alice_api, bob_api):
    script_id = alice_api.post("/api/v1/scripts/create/", {"name": "agent", "content": SCRIPT}, format="json").json()[
        "asset_id"
    ]
    reward_id = alice_api.post("/api/v1/rewards/create/", {"name": "exact", "content": REWARD}, format="json").json()[
        "asset_id"
    ]
    for path in (
        f"scripts/{script_id}/",
        f"scripts/{script_id}/versions/",
        f"scripts/{script_id}/versions/1/",
        f"rewards/{reward_id}/",
        f"rewards/{reward_id}/versions/",
        f"rewards/{reward_id}/versions/1/",
    ):
        response = bob_api.get(f"/api/v1/{path}")
        assert_error(response, 404)
        assert "scenario[" not in response.content.decode()
    assert_error(
        bob_api.post(f"/api/v1/scripts/{script_id}/versions/create/", {"content": SCRIPT + "#"}, format="json"), 404
    )
    assert_error(
        bob_api.post(f"/api/v1/rewards/{reward_id}/versions/create/", {"content": REWARD + "#"}, format="json"), 404
    )
    assert RolloutScriptVersion.objects.count() == 1 and RewardFunctionVersion.objects.count() == 1
    assert bob_api.get("/api/v1/scripts/").json()["count"] == 0


def test_a_script_names_its_companion_reward_and_only_an_own_one(alice_api, alice, bob):
    reward = alice_api.post("/api/v1/rewards/create/", {"name": "judge", "content": REWARD}, format="json").json()
    created = alice_api.post(
        "/api/v1/scripts/create/",
        {"name": "agent", "content": SCRIPT, "companion_reward": reward["asset_id"]},
        format="json",
    )
    assert created.status_code == 201, created.json()
    script_id = created.json()["asset_id"]
    assert alice_api.get(f"/api/v1/scripts/{script_id}/").json()["companion_reward"] == reward["asset_id"]

    cleared = alice_api.put(f"/api/v1/scripts/{script_id}/companion/", {"companion_reward": None}, format="json")
    assert cleared.status_code == 200 and cleared.json()["companion_reward"] is None

    theirs = RewardFunction.objects.create(owner=bob, name="bobs")
    assert_error(
        alice_api.put(f"/api/v1/scripts/{script_id}/companion/", {"companion_reward": theirs.id}, format="json"), 404
    )
    assert RolloutScript.objects.get(id=script_id).companion_reward is None
