"""One scenario has one number on every page: its index in the set (from 0), never its database id. The run
page's live groups, the trajectory inspector, the heatmap and the scenario set's page agree."""

import pytest
from django.urls import reverse

from artweb.testing.factories import RunFactory, TrajectoryFactory, TrajectoryGroupFactory
from rollouts.models import Scenario

pytestmark = pytest.mark.django_db


def test_the_run_page_inspector_heatmap_and_scenario_set_page_show_the_same_number(client, alice):
    run = RunFactory(owner=alice, status="running")
    scenario = Scenario.objects.get(scenario_set=run.scenario_set, index=3)
    assert scenario.id != scenario.index  # else the id shown by mistake would pass for the number
    group = TrajectoryGroupFactory(run=run, step=1, scenario=scenario, reward_mean=0.5)
    TrajectoryFactory(group=group, index=0, reward=0.5)
    client.force_login(alice)

    # The run page's groups (first paint; the live messages are built by the same function): the number
    # run_page.js prints as "scenario N".
    page = client.get(reverse("run-detail", args=[run.id]))
    (shown,) = [g for g in page.context["page_data"]["groups"] if g["id"] == group.id]
    assert shown["scenario_index"] == 3 and shown["scenario"] == scenario.id

    inspector = client.get(reverse("run-trajectories", args=[run.id]) + "?step=1").content.decode()
    assert "Scenario 3 " in inspector and f"Scenario {scenario.id} " not in inspector

    heatmap = client.get(reverse("run-heatmap", args=[run.id])).context["page_data"]["heatmap"]
    assert heatmap["rows"]["scenario"] == [scenario.id] and heatmap["rows"]["index"] == [3]

    listing = client.get(reverse("scenario-set-detail", args=[run.scenario_set.id])).content.decode()
    assert '<td class="num">3</td><td>train</td><td><code>' + str(scenario.data) in listing.replace("&#x27;", "'")
