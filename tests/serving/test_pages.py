"""The playground and diff pages, the diff API and the serving admin render for their owner from stored
jobs (no worker: the jobs are written as a finished one leaves them), and nobody else sees them."""

import csv
import io

import pytest
from django.urls import reverse

from artweb.testing.factories import BaseModelFactory, RewardFunctionVersionFactory, ScenarioSetFactory
from training.serving.models import DiffScenario, ServeJob

pytestmark = pytest.mark.django_db


@pytest.fixture
def jobs(alice):
    BaseModelFactory(owner=None, name="shared-model")
    scenario_set = ScenarioSetFactory(owner=alice)
    reward = RewardFunctionVersionFactory(asset__owner=alice)
    answer = {"content": "w5", "tool_calls": [], "reward": 1.0, "reward_error": "", "metrics": {}}
    playground = ServeJob.objects.create(
        owner=alice,
        kind=ServeJob.Kind.PLAYGROUND,
        status=ServeJob.Status.DONE,
        model_names=["shared-model"],
        params={"prompt": "Say w5.", "samples": 1, "temperature": 1.0, "max_tokens": 8, "tools": None},
        result={
            "messages": [{"role": "user", "content": "Say w5."}],
            "scenario": {"prompt": "Say w5."},
            "columns": [
                {"model": "shared-model", "answers": [{**answer, "tokens": []}], "error": "", "mean_reward": 1.0}
            ],
        },
    )
    diff = ServeJob.objects.create(
        owner=alice,
        kind=ServeJob.Kind.DIFF,
        status=ServeJob.Status.DONE,
        model_names=["shared-model", "shared-model"],
        scenario_set=scenario_set,
        reward_version=reward,
        params={"samples": 1, "temperature": 1.0, "max_tokens": 8, "max_scenarios": 2, "seed": 0, "system": ""},
        result={"scenarios": 2, "paired": 2, "mean_a": 0.5, "mean_b": 0.75, "mean_delta": 0.25},
    )
    for delta, scenario in zip((0.0, 0.5), scenario_set.scenarios.filter(split="validation"), strict=True):
        DiffScenario.objects.create(
            job=diff,
            scenario=scenario,
            index=scenario.index,
            reward_a=0.5,
            reward_b=0.5 + delta,
            delta=delta,
            answers_a=[answer],
            answers_b=[{**answer, "content": f"w{scenario.index}"}],
        )
    return {"playground": playground, "diff": diff}


def test_the_pages_show_the_owners_sessions_and_diffs(client, alice, jobs):
    client.force_login(alice)
    diff = jobs["diff"]
    for url in (
        reverse("playground"),
        reverse("playground-session", args=[jobs["playground"].id]),
        reverse("diff-list"),
        reverse("diff-detail", args=[diff.id]),
    ):
        response = client.get(url)
        assert response.status_code == 200, url
    page = client.get(reverse("diff-detail", args=[diff.id])).content.decode()
    assert page.count('class="panel diff-row"') == 2 and 'id="mean-delta"' in page
    assert f"#{diff.id}" in client.get(reverse("diff-list")).content.decode()
    assert "shared-model" in client.get(reverse("playground")).content.decode()  # a model to choose


def test_nobody_else_sees_them(client, bob, jobs):
    client.force_login(bob)
    assert client.get(reverse("playground-session", args=[jobs["playground"].id])).status_code == 404
    assert client.get(reverse("diff-detail", args=[jobs["diff"].id])).status_code == 404
    assert client.get(reverse("api-diff-scenarios", args=[jobs["diff"].id])).status_code == 404
    assert client.get(reverse("api-diffs")).json()["results"] == []


def test_the_api_lists_a_diffs_scenarios_biggest_change_first_and_exports_them(client, alice, jobs):
    client.force_login(alice)
    diff = jobs["diff"]
    assert [j["id"] for j in client.get(reverse("api-diffs")).json()["results"]] == [diff.id]
    assert client.get(reverse("api-playground", args=[jobs["playground"].id])).json()["status"] == "done"
    rows = client.get(reverse("api-diff-scenarios", args=[diff.id])).json()["results"]
    assert [r["delta"] for r in rows] == [0.5, 0.0]
    exported = client.get(reverse("api-diff-export", args=[diff.id]) + "?as=json").json()
    assert exported["id"] == diff.id and [r["delta"] for r in exported["scenarios"]] == [0.5, 0.0]
    lines = list(
        csv.reader(io.StringIO(client.get(reverse("api-diff-export", args=[diff.id]) + "?as=csv").content.decode()))
    )
    assert lines[0][:5] == ["index", "scenario", "reward_a", "reward_b", "delta"] and len(lines) == 3


def test_staff_see_the_serving_rows_in_the_admin(client, staff, jobs):
    client.force_login(staff)
    for url in (
        "/admin/serving/servejob/",
        f"/admin/serving/servejob/{jobs['diff'].id}/change/",
        "/admin/serving/checkpointalias/",
    ):
        assert client.get(url).status_code == 200, url


@pytest.mark.parametrize("who, seen", [("alice", True), ("bob", False), ("staff", True)])
def test_the_owner_and_staff_see_a_session_and_a_diff_and_nobody_else(client, request, jobs, who, seen):
    """Sessions and diffs follow the one rule (artweb.visibility): staff see everyone's, as they see runs."""
    client.force_login(request.getfixturevalue(who))
    playground, diff = jobs["playground"].id, jobs["diff"].id
    for url in (
        reverse("playground-session", args=[playground]),
        reverse("diff-detail", args=[diff]),
        reverse("api-playground", args=[playground]),
        reverse("api-diff", args=[diff]),
        reverse("api-diff-scenarios", args=[diff]),
    ):
        assert client.get(url).status_code == (200 if seen else 404), url
    assert (diff in [j["id"] for j in client.get(reverse("api-diffs")).json()["results"]]) is seen
    assert (f"#{diff}" in client.get(reverse("diff-list")).content.decode()) is seen


@pytest.mark.parametrize("who, allowed", [("alice", True), ("bob", False), ("staff", True)])
def test_a_diff_may_use_the_scenario_sets_and_rewards_one_may_see(client, request, jobs, who, allowed):
    """As a run may: its form offers them and the service takes them (artweb.visibility)."""
    diff = jobs["diff"]
    client.force_login(request.getfixturevalue(who))
    form = {"model_a": "shared-model", "model_b": "shared-model", "samples": 1, "temperature": 1.0, "max_tokens": 8}
    form |= {"scenario_set": diff.scenario_set_id, "reward": diff.reward_version_id, "max_scenarios": 2, "seed": 0}
    response = client.post(reverse("diff-list"), form)
    assert response.status_code == (302 if allowed else 200)
    assert ServeJob.objects.filter(kind=ServeJob.Kind.DIFF).count() == (2 if allowed else 1)
