"""Who sees what through the pages, object kind by object kind (artweb.visibility): the owner and staff
see a row's page, anyone else gets a 404. Settings that a person's runs resolve by name (judge
endpoints, export targets) are the signed-in person's own on these pages, staff's too: everyone's are
in the admin, which shows staff every row."""

import pytest
from django.urls import reverse

from tests.owned_rows import dry_run_of, export_target_of, judge_of, rescore_of, run_of

pytestmark = pytest.mark.django_db


# kind -> (a row of owner's -> its page, whether staff see it here)
KINDS = {
    "run": (lambda owner: reverse("run-detail", args=[run_of(owner).id]), True),
    "run's trajectories": (lambda owner: reverse("run-trajectories", args=[run_of(owner).id]), True),
    "run's re-scores": (lambda owner: reverse("run-rescores", args=[run_of(owner).id]), True),
    "script": (lambda owner: reverse("script-detail", args=[run_of(owner).script_version.asset_id]), True),
    "reward": (lambda owner: reverse("reward-detail", args=[run_of(owner).reward_version.asset_id]), True),
    "scenario set": (lambda owner: reverse("scenario-set-detail", args=[run_of(owner).scenario_set_id]), True),
    "dry run": (lambda owner: reverse("dry-run-detail", args=[dry_run_of(owner).id]), True),
    "re-score": (lambda owner: reverse("rescore-detail", args=[rescore_of(owner).id]), True),
    "export target": (lambda owner: reverse("export-detail", args=[export_target_of(owner).id]), False),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("who", ["bob", "alice", "staff"])
def test_the_owner_and_staff_see_a_rows_page_and_nobody_else(request, as_user, bob, kind, who):
    make, staff_see = KINDS[kind]
    url = make(bob)
    seen = {"bob": True, "alice": False, "staff": staff_see}[who]
    assert as_user(request.getfixturevalue(who)).get(url).status_code == (200 if seen else 404)


@pytest.mark.parametrize("who, shown", [("bob", True), ("alice", False), ("staff", False)])
def test_the_models_page_lists_and_deletes_only_ones_own_judges(request, as_user, bob, who, shown):
    judge = judge_of(bob, name="bobs-judge")
    client = as_user(request.getfixturevalue(who))
    assert ("bobs-judge" in client.get(reverse("model-list")).content.decode()) is shown
    response = client.post(reverse("judge-delete", args=[judge.id]))
    assert response.status_code == (302 if shown else 404)
    assert type(judge).objects.filter(id=judge.id).exists() is not shown


@pytest.mark.parametrize("who, owner_column", [("bob", False), ("staff", True)])
def test_lists_name_the_owner_to_those_who_see_everyones(request, as_user, bob, who, owner_column):
    run_of(bob)
    client = as_user(request.getfixturevalue(who))
    for name in ("run-list", "script-list", "reward-list", "scenario-set-list"):
        assert ("Owner</th>" in client.get(reverse(name)).content.decode()) is owner_column, name


def test_staff_see_in_the_admin_what_they_see_on_the_pages(as_user, alice, bob, staff):
    runs = [run_of(alice), run_of(bob)]
    client = as_user(staff)
    admin_page = client.get(reverse("admin:training_run_changelist")).content.decode()
    runs_page = client.get(reverse("run-list")).content.decode()
    assert all(run.name in admin_page and run.name in runs_page for run in runs)
