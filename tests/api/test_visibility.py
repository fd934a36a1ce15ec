"""Who sees what through the API, object kind by object kind (artweb.visibility): the owner and staff see
a row, anyone else gets a 404 (never a 403: no existence leak). Settings that a person's runs resolve by
name (judge endpoints, export targets) are the signed-in person's own here, staff's too: everyone's are
in the admin."""

import pytest

from artweb.testing.factories import BaseModelFactory
from tests.owned_rows import dry_run_of, export_target_of, judge_of, rescore_of, run_of

pytestmark = pytest.mark.django_db


# kind -> (a row of owner's -> its URL, whether staff see it here)
KINDS = {
    "run": (lambda owner: f"/api/v1/runs/{run_of(owner).id}/", True),
    "run's checkpoints": (lambda owner: f"/api/v1/runs/{run_of(owner).id}/checkpoints/", True),
    "run's trajectories": (lambda owner: f"/api/v1/runs/{run_of(owner).id}/trajectories/", True),
    "run's events": (lambda owner: f"/api/v1/runs/{run_of(owner).id}/events/", True),
    "script": (lambda owner: f"/api/v1/scripts/{run_of(owner).script_version.asset_id}/", True),
    "reward": (lambda owner: f"/api/v1/rewards/{run_of(owner).reward_version.asset_id}/", True),
    "scenario set": (lambda owner: f"/api/v1/scenario-sets/{run_of(owner).scenario_set_id}/", True),
    "dry run": (lambda owner: f"/api/v1/dry-runs/{dry_run_of(owner).id}/", True),
    "run's re-scores": (lambda owner: f"/api/v1/runs/{run_of(owner).id}/rescores/", True),
    "re-score": (lambda owner: f"/api/v1/rescores/{rescore_of(owner).id}/", True),
    "judge endpoint": (lambda owner: f"/api/v1/judges/{judge_of(owner).id}/", False),
    "export target": (lambda owner: f"/api/v1/export-targets/{export_target_of(owner).id}/", False),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("who", ["bob", "alice", "staff"])
def test_the_owner_and_staff_see_a_row_and_nobody_else(request, bob, kind, who):
    make, staff_see = KINDS[kind]
    url = make(bob)
    seen = {"bob": True, "alice": False, "staff": staff_see}[who]
    response = request.getfixturevalue(f"{who}_api").get(url)
    assert response.status_code == (200 if seen else 404), response.content


@pytest.mark.parametrize(
    "who, listed", [("alice", {"shared", "alice-model"}), ("staff", {"shared", "alice-model", "bobs"})]
)
def test_base_models_are_the_shared_and_ones_own_and_staff_see_all(request, alice, bob, who, listed):
    BaseModelFactory(name="shared")
    BaseModelFactory(name="alice-model", owner=alice)
    BaseModelFactory(name="bobs", owner=bob)
    body = request.getfixturevalue(f"{who}_api").get("/api/v1/base-models/").json()
    assert {m["name"] for m in body["results"]} == listed


@pytest.mark.parametrize("who, listed", [("bob", {"bob-run"}), ("alice", set()), ("staff", {"bob-run"})])
def test_the_runs_list_shows_what_the_detail_shows(request, bob, who, listed):
    run_of(bob)
    body = request.getfixturevalue(f"{who}_api").get("/api/v1/runs/").json()
    assert {r["name"] for r in body["results"]} == listed


@pytest.mark.parametrize("who", ["alice", "staff"])
def test_settings_lists_hold_only_ones_own(request, bob, who):
    judge_of(bob)
    export_target_of(bob)
    api = request.getfixturevalue(f"{who}_api")
    assert api.get("/api/v1/judges/").json() == []
    assert api.get("/api/v1/export-targets/").json()["results"] == []


def test_staff_may_point_a_target_of_theirs_at_any_run_as_the_service_allows(staff_api, alice_api, bob):
    run = run_of(bob)
    body = {"kind": "wandb", "settings": {"project": "p"}, "run": run.id}
    assert staff_api.post("/api/v1/export-targets/create/", body, format="json").status_code == 201
    assert alice_api.post("/api/v1/export-targets/create/", body, format="json").status_code == 400
