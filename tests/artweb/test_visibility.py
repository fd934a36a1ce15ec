"""The one visibility rule (artweb.visibility), row kind by row kind: staff see and change every row;
anyone else sees and changes their own, and sees the shared ones; nobody signed in sees nothing. The
settings a person's runs resolve by name (judge endpoints, export targets) are looked up among their
own, staff's too."""

import pytest
from django.contrib.auth.models import AnonymousUser

from artweb.errors import ApplicationError
from artweb.testing.factories import (
    BaseModelFactory,
    RewardFunctionVersionFactory,
    RolloutScriptVersionFactory,
    RunFactory,
    ScenarioSetFactory,
)
from artweb.visibility import may_change, may_see, own, require_visible, sees_everything, visible
from tests.owned_rows import dry_run_of, judge_of, rescore_of
from training.models import JudgeEndpoint

pytestmark = pytest.mark.django_db


# kind -> (a row of owner's, the lookup path to its owner)
KINDS = {
    "run": (lambda owner: RunFactory(owner=owner), "owner"),
    "base model": (lambda owner: BaseModelFactory(name=f"{owner.username}-model", owner=owner), "owner"),
    "script version": (lambda owner: RolloutScriptVersionFactory(asset__owner=owner), "asset__owner"),
    "reward version": (lambda owner: RewardFunctionVersionFactory(asset__owner=owner), "asset__owner"),
    "scenario set": (lambda owner: ScenarioSetFactory(owner=owner), "owner"),
    "dry run": (dry_run_of, "owner"),
    "re-score": (rescore_of, "owner"),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("who, allowed", [("bob", True), ("alice", False), ("staff", True)])
def test_it_lets_the_owner_and_staff_see_and_change_a_row_and_nobody_else(request, bob, kind, who, allowed):
    make, owner_field = KINDS[kind]
    row = make(bob)
    user = request.getfixturevalue(who)
    assert visible(type(row).objects.all(), user, owner_field=owner_field).filter(id=row.id).exists() is allowed
    assert may_see(user, row, owner_field=owner_field) is allowed
    assert may_change(user, row, owner_field=owner_field) is allowed


@pytest.mark.parametrize("who", ["alice", "staff"])
def test_a_shared_row_is_seen_by_everyone_and_changed_by_staff_only(request, who):
    shared = BaseModelFactory(name="shared", owner=None)
    user = request.getfixturevalue(who)
    assert visible(type(shared).objects.all(), user).filter(id=shared.id).exists()
    assert may_see(user, shared)
    assert may_change(user, shared) is (who == "staff")


def test_nobody_signed_in_sees_nothing(bob):
    BaseModelFactory(name="shared", owner=None)
    for kind, (make, owner_field) in KINDS.items():
        row = make(bob)
        assert not visible(type(row).objects.all(), AnonymousUser(), owner_field=owner_field).exists(), kind
        assert not may_see(AnonymousUser(), row, owner_field=owner_field), kind
        assert not may_change(None, row, owner_field=owner_field), kind
    assert not sees_everything(AnonymousUser())


@pytest.mark.parametrize("who, found", [("bob", True), ("alice", False), ("staff", False)])
def test_settings_are_looked_up_among_ones_own_even_for_staff(request, bob, who, found):
    endpoint = judge_of(bob)
    user = request.getfixturevalue(who)
    assert own(JudgeEndpoint.objects.all(), user).filter(id=endpoint.id).exists() is found
    # Whoever may change it elsewhere (the admin, the services) is decided by the one rule.
    assert may_change(user, endpoint) is (who != "alice")


def test_a_service_refuses_what_the_user_may_not_see_on_the_field_that_named_it(alice, bob, staff):
    scenario_set = ScenarioSetFactory(owner=bob)
    with pytest.raises(ApplicationError, match="That scenario set is not yours.") as exc:
        require_visible(alice, scenario_set, what="scenario set", field="scenario_set")
    assert exc.value.field_errors == {"scenario_set": ["not found"]}
    require_visible(staff, scenario_set, what="scenario set", field="scenario_set")
    require_visible(bob, scenario_set, what="scenario set", field="scenario_set")
