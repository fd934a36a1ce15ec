"""`manage.py seed_demo`: the example task, loaded once for the admin."""

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from rollouts.models import RewardFunction, RolloutScript, ScenarioSet

pytestmark = pytest.mark.django_db


def seed(**kwargs) -> str:
    out = StringIO()
    call_command("seed_demo", stdout=out, **kwargs)
    return out.getvalue()


def test_it_loads_the_example_task_once(staff):
    seed()
    scenarios = ScenarioSet.objects.get(owner=staff)
    assert RolloutScript.objects.get(owner=staff).versions.count() == 1
    assert RewardFunction.objects.get(owner=staff).versions.count() == 1
    assert scenarios.train_count > 0 and scenarios.validation_count > 0

    assert "exists already" in seed()
    assert (RolloutScript.objects.count(), RewardFunction.objects.count(), ScenarioSet.objects.count()) == (1, 1, 1)


def test_it_needs_an_admin(alice):
    with pytest.raises(CommandError, match="createsuperuser"):
        seed()


def test_it_loads_for_a_named_user(alice):
    seed(owner="alice")
    assert ScenarioSet.objects.filter(owner=alice).exists()
