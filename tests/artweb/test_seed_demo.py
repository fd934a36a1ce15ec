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


def test_it_loads_the_example_task_and_the_tool_example_once(staff):
    seed()
    scenarios = ScenarioSet.objects.get(owner=staff, name="Example scenarios")
    assert RolloutScript.objects.get(owner=staff, name="Example rollout").versions.count() == 1
    assert RewardFunction.objects.get(owner=staff).versions.count() == 1
    assert scenarios.train_count > 0 and scenarios.validation_count > 0
    tools = ScenarioSet.objects.get(owner=staff, name="Example tool scenarios")
    assert (tools.train_count, tools.validation_count) == (48, 12)  # the file's own split
    agent = RolloutScript.objects.get(owner=staff, name="Example tool agent")
    assert "lookup_capital" in agent.latest_version.content and agent.companion_reward is None  # its own reward

    assert "exists already" in seed()
    assert (RolloutScript.objects.count(), RewardFunction.objects.count(), ScenarioSet.objects.count()) == (2, 1, 2)


def test_it_needs_an_admin(alice):
    with pytest.raises(CommandError, match="createsuperuser"):
        seed()


def test_it_loads_for_a_named_user(alice):
    seed(owner="alice")
    assert ScenarioSet.objects.filter(owner=alice).exists()
