"""A client-driven run on every page, API, admin page and export summary: each renders, and says what
is particular to it (its rollouts run in the ART client, the client's last call, its training jobs)
where a script's run names its script. The run is built from rows, as registering and two committed
training jobs leave it."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from artweb.cli.runs import _client_rows
from artweb.testing.client_factories import ClientRunFactory, ClientTrainingJobFactory
from artweb.testing.factories import (
    BaseModelFactory,
    CheckpointFactory,
    RunFactory,
    StepFactory,
    TrajectoryFactory,
    TrajectoryGroupFactory,
)
from rollouts.models import Scenario
from training.client_runs.models import ClientModel, ClientTrainingJob
from training.exports.langfuse import trajectory_events
from training.exports.wandb import _run_config

pytestmark = pytest.mark.django_db


@pytest.fixture
def client_run(alice):
    """alice's run geo/agent-1, driven by an ART client last heard from 5 minutes ago: two committed
    training jobs (steps 1 and 2) and a failed third, one group of the step 2 on the scenario the client
    sent ({"city": "Paris"}), the step 2 checkpoint."""
    BaseModelFactory()
    run = ClientRunFactory(
        owner=alice,
        project="geo",
        model_name="agent-1",
        steps_done=2,
        num_steps=2,
        latest_reward=0.5,
        client_model__contacted_at=timezone.now() - timedelta(minutes=5, seconds=3),
    )
    scenario = Scenario.objects.create(scenario_set=run.scenario_set, index=0, split="train", data={"city": "Paris"})
    for step in (1, 2):
        StepFactory(run=run, step=step, reward_mean=0.25 * step, metrics={"loss": 0.1, "client_turns_sampled": 4})
        ClientTrainingJobFactory(run=run, step=step, groups=[{"scenario": scenario.id, "trajectories": []}] * 2)
    ClientTrainingJobFactory(
        run=run, status=ClientTrainingJob.Status.FAILED, step=None, error="The run was paused on artweb."
    )
    group = TrajectoryGroupFactory(run=run, step=2, scenario=scenario, reward_mean=0.5, reward_std=0.5)
    sampled = {"role": "assistant", "content": "The capital is Paris.", "sampled": True, "token_ids": [5, 6]}
    trajs = [
        TrajectoryFactory(
            group=group,
            index=i,
            reward=1.0 - i,
            messages=[{"role": "user", "content": "Capital of France?"}, sampled],
            search_text="Capital of France? The capital is Paris.",
        )
        for i in range(2)
    ]
    checkpoint = CheckpointFactory(run=run, step=2, path=f"/nonexistent/artweb-test/{run.id}/2")
    return {"run": run, "group": group, "trajs": trajs, "checkpoint": checkpoint, "scenario": scenario}


def _page(client, url) -> str:
    response = client.get(url)
    assert response.status_code == 200, url
    return response.content.decode()


# --- the run page -------------------------------------------------------------------------------------


def test_the_run_page_says_where_the_rollouts_run_and_when_the_client_last_called(client, alice, client_run):
    client.force_login(alice)
    run = client_run["run"]
    body = _page(client, reverse("run-detail", args=[run.id]))

    assert "in the ART client <code>alice/geo/agent-1</code>" in body
    assert ">5\xa0minutes ago</time>" in body  # the client's last contact, as a relative time
    assert 'id="run-client-jobs"' in body and ">3 <span" in body  # three jobs posted
    assert '<span class="badge status-failed" title="The run was paused on artweb.">failed</span>' in body
    assert "wandb-artifact:///alice/geo/agent-1" in body  # the name it samples from (Config tab)
    assert ">waiting for its client</span>" in body  # the status badge
    # No script, no "launch similar": the page's own actions only (a waiting run may be cancelled or paused).
    assert "Rollout script" not in body and "Launch similar" not in body and "?from=" not in body
    assert '<button type="submit" class="danger" data-action="cancel" >' in body
    assert 'data-action="resume" disabled' in body
    # The checkpoints tab as for any run.
    assert 'Checkpoints (<span id="checkpoints-count">1</span>)' in body
    assert reverse("checkpoint-download", args=[run.id, client_run["checkpoint"].id]) in body


def test_the_run_page_says_so_when_the_client_deleted_its_model(client, alice, client_run):
    run = client_run["run"]
    ClientModel.objects.filter(run=run).delete()  # what backend.delete(model) leaves: the run, without its model
    client.force_login(alice)
    body = _page(client, reverse("run-detail", args=[run.id]))
    assert 'in the ART client <span class="muted">(it deleted its model)</span>' in body
    assert 'id="run-client-contact"' in body


def test_a_client_heard_from_this_minute_was_in_contact_just_now(client, alice):
    BaseModelFactory()
    run = ClientRunFactory(owner=alice, client_model__contacted_at=timezone.now() - timedelta(seconds=20))
    client.force_login(alice)
    body = _page(client, reverse("run-detail", args=[run.id]))
    assert ">just now</time>" in body
    assert 'id="run-client-jobs"><div class="label">Training jobs</div><div class="value">0</div>' in body


def test_a_script_runs_page_still_names_its_script(client, alice):
    run = RunFactory(owner=alice)
    client.force_login(alice)
    body = _page(client, reverse("run-detail", args=[run.id]))
    script = run.script_version
    assert f"{script.asset.name} v{script.number}</div>" in body  # the Task stat
    assert reverse("script-detail", args=[script.asset_id]) in body  # the Config tab's link
    assert f"?from={run.id}" in body and "Launch similar" in body
    assert "in the ART client" not in body and 'id="run-client-contact"' not in body


def test_launching_from_a_client_run_copies_nothing(client, alice, client_run):
    client.force_login(alice)
    run = client_run["run"]
    response = client.get(reverse("run-launch") + f"?from={run.id}")
    assert response.status_code == 200
    body = response.content.decode()
    assert "is driven by an ART client: it has no script to launch again." in body
    assert "(copy)" not in body


# --- lists and analysis pages --------------------------------------------------------------------------


def test_the_runs_list_shows_the_art_client_as_its_task_and_filters_by_waiting(client, alice, client_run):
    RunFactory(owner=alice, name="script-run", status="queued")
    client.force_login(alice)
    body = _page(client, reverse("run-list"))
    row = body[body.index(f'<tr data-run="{client_run["run"].id}">') :]
    row = row[: row.index("</tr>")]
    assert '<td class="hide-narrow">ART client</td>' in row
    assert '<span class="badge status-waiting" data-status>waiting for its client</span>' in row
    assert '<option value="waiting">Waiting for its client</option>' in body  # the status menu

    waiting = _page(client, reverse("run-list") + "?status=waiting")
    assert "alice/geo/agent-1" in waiting and "script-run" not in waiting
    found = _page(client, reverse("run-list") + "?q=ART+client")
    assert "alice/geo/agent-1" in found and "script-run" not in found


def test_the_inspector_shows_the_clients_groups_and_trajectories(client, alice, client_run):
    client.force_login(alice)
    run, traj = client_run["run"], client_run["trajs"][0]
    body = _page(client, reverse("run-trajectories", args=[run.id]))
    assert f"traj={traj.id}" in body
    body = _page(client, reverse("run-trajectories", args=[run.id]) + f"?step=2&traj={traj.id}")
    assert "Capital of France?" in body and "The capital is Paris." in body


def test_the_heatmap_has_a_row_for_the_scenario_the_client_sent(client, alice, client_run):
    client.force_login(alice)
    response = client.get(reverse("run-heatmap", args=[client_run["run"].id]))
    assert response.status_code == 200
    heatmap = response.context["page_data"]["heatmap"]
    assert heatmap["columns"] == {"first_step": [2], "last_step": [2]}
    assert heatmap["rows"]["scenario"] == [client_run["scenario"].id]
    assert heatmap["rows"]["text"] == ['{"city": "Paris"}']


def test_compare_puts_a_client_run_beside_a_script_run(client, alice, client_run):
    script_run = RunFactory(owner=alice, name="script-run")
    client.force_login(alice)
    response = client.get(reverse("run-compare") + f"?runs={client_run['run'].id}&runs={script_run.id}")
    assert response.status_code == 200
    differences = {row["key"]: row["values"] for row in response.context["differences"]}
    script = script_run.script_version
    assert differences["script"] == ["ART client", f"{script.asset.name} v{script.number}"]
    assert ">waiting for its client</span>" in response.content.decode()


# --- the REST API ---------------------------------------------------------------------------------------


def test_the_run_api_gives_a_client_run_with_a_null_script_and_its_client(client, alice, client_run):
    client.force_login(alice)
    run = client_run["run"]
    detail = client.get(f"/api/v1/runs/{run.id}/").json()
    assert detail["driver"] == "client" and detail["script"] is None and detail["reward"] is None
    assert detail["status"] == "waiting" and detail["actions"] == ["cancel", "pause"]
    assert detail["client"]["model"] == "alice/geo/agent-1"
    assert detail["client"]["inference_name"] == "wandb-artifact:///alice/geo/agent-1"
    assert detail["client"]["jobs"] == 3
    assert detail["client"]["last_job"] == {"status": "failed", "step": None, "error": "The run was paused on artweb."}
    assert detail["client"]["contacted_at"]

    listed = {r["id"]: r for r in client.get("/api/v1/runs/?status=waiting").json()["results"]}
    assert listed[run.id]["script"] is None and listed[run.id]["driver"] == "client"


def test_the_run_api_gives_a_script_run_its_script_and_no_client(client, alice):
    run = RunFactory(owner=alice)
    client.force_login(alice)
    detail = client.get(f"/api/v1/runs/{run.id}/").json()
    assert detail["driver"] == "script" and detail["client"] is None
    assert detail["script"]["version_id"] == run.script_version_id


def test_the_cli_shows_a_client_run_where_a_run_names_its_script():
    client = {
        "model": "alice/geo/agent-1",
        "contacted_at": "2026-03-01T10:20:30.123456Z",
        "jobs": 3,
        "last_job": {"status": "done", "step": 2, "error": ""},
    }
    assert _client_rows(client) == [
        ("rollouts", "in the ART client alice/geo/agent-1"),
        ("last contact", "2026-03-01 10:20:30"),
        ("training jobs", "3 (last: done)"),
    ]
    assert _client_rows(None) == [("rollouts", "in an ART client")]


# --- the admin -------------------------------------------------------------------------------------------


def test_the_admin_lists_and_shows_the_clients_models_read_only(client, staff, client_run):
    client.force_login(staff)
    run = client_run["run"]
    model = ClientModel.objects.get(run=run)
    body = _page(client, reverse("admin:client_runs_clientmodel_changelist"))
    assert "alice/geo/agent-1" in body
    body = _page(client, reverse("admin:client_runs_clientmodel_change", args=[model.id]))
    assert "wandb-artifact:///alice/geo/agent-1" in body and 'name="project"' not in body  # read only
    assert client.get(reverse("admin:client_runs_clientmodel_add")).status_code == 403

    body = _page(client, reverse("admin:training_run_change", args=[run.id]))
    assert "ART client" in body  # its driver
    body = _page(client, reverse("admin:training_run_changelist") + "?driver__exact=client")
    assert "alice/geo/agent-1" in body


def test_the_admin_lists_and_shows_the_training_jobs_with_their_events(client, staff, client_run):
    client.force_login(staff)
    run = client_run["run"]
    jobs = list(ClientTrainingJob.objects.filter(run=run).order_by("id"))
    body = _page(client, reverse("admin:client_runs_clienttrainingjob_changelist") + f"?run__id__exact={run.id}")
    assert "The run was paused on artweb." in body and body.count("field-status") == 3
    body = _page(client, reverse("admin:client_runs_clienttrainingjob_change", args=[jobs[1].id]))
    assert "2 groups, 0 trajectories" in body
    assert "training_started" in body and "gradient_step" in body and "training_ended" in body  # its events

    assert client.get(reverse("admin:client_runs_clienttrainingjob_add")).status_code == 403


# --- exports ---------------------------------------------------------------------------------------------


def test_the_exports_describe_a_client_run(client_run):
    run = client_run["run"]
    config = _run_config(run)["artweb"]
    assert config["driver"] == "client"
    assert config["script_version"] is None and config["reward_version"] is None
    assert config["scenario_set"] == "ART client: alice/geo/agent-1"

    events = trajectory_events(run, client_run["trajs"][0], uuid.uuid4())
    trace = events[0]["body"]
    assert trace["release"] == "ART client"
    assert trace["output"]["content"] == "The capital is Paris."
    assert {e["body"]["name"] for e in events if e["type"] == "score-create"} == {"reward"}
