"""Forms show service errors inline, under the field they concern; actions call the services."""

import json

import pytest
from django.urls import reverse

from artweb.testing.factories import (
    REWARD,
    SCRIPT,
    BaseModelFactory,
    RewardFunctionVersionFactory,
    RolloutScriptVersionFactory,
    RunFactory,
    ScenarioSetFactory,
)
from rollouts.models import RolloutScript, ScenarioSet
from training.models import DryRun, PretrainedModel, Run, RunEvent


def _errors(response, field) -> list[str]:
    return list(response.context["form"].errors.get(field, []))


@pytest.fixture
def launchable(alice):
    return {
        "base_model": BaseModelFactory(),
        "script_version": RolloutScriptVersionFactory(asset__owner=alice),
        "reward_version": RewardFunctionVersionFactory(asset__owner=alice),
        "scenario_set": ScenarioSetFactory(owner=alice),
    }


def _launch_data(objs, **extra):
    data = {
        "name": "my run",
        "tags": "a, b",
        "base_model": objs["base_model"].id,
        "script_version": objs["script_version"].id,
        "reward_version": objs["reward_version"].id,
        "scenario_set": objs["scenario_set"].id,
        "num_steps": 5,
        "group_size": 4,
        "train": "",
    }
    data.update(extra)
    return data


def test_it_launches_a_run_through_the_service(as_user, alice, launchable, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        response = as_user(alice).post(reverse("run-launch"), _launch_data(launchable, train='{"learning_rate": 1e-5}'))
    run = Run.objects.get(name="my run")
    assert response.status_code == 302 and response["Location"] == reverse("run-detail", args=[run.id])
    assert run.owner == alice and run.tags == ["a", "b"] and run.num_steps == 5
    assert run.config["group_size"] == 4 and run.config["train"]["learning_rate"] == 1e-5
    assert run.config["temperature"] == 1.0  # left blank on the form: the schema default
    assert callbacks  # the step task is enqueued after commit


def test_it_shows_config_bounds_and_help_on_the_launch_form(as_user, alice, launchable):
    body = as_user(alice).get(reverse("run-launch")).content.decode()
    assert "Rollouts per scenario; GRPO compares them" in body  # RunConfig's description
    assert 'name="group_size"' in body and 'min="2"' in body and 'max="64"' in body
    assert "learning_rate" in body  # the TrainConfig reference table


@pytest.mark.parametrize(
    "extra, field, fragment",
    [
        ({"num_steps": 0}, "num_steps", "greater than or equal to 1"),
        ({"train": "{not json"}, "train", "Not valid JSON"),
        ({"train": '{"learning_rat": 1}'}, "train", "unknown config key"),
        ({"train": '{"learning_rate": 5}'}, "train", "learning_rate must be in"),
        ({"name": "x" * 201}, "name", "at most 200 characters"),
    ],
)
def test_it_shows_launch_errors_inline(as_user, alice, launchable, extra, field, fragment):
    response = as_user(alice).post(reverse("run-launch"), _launch_data(launchable, **extra))
    assert response.status_code == 200
    assert any(fragment in e for e in _errors(response, field)), response.context["form"].errors
    assert not Run.objects.exists()


def test_it_refuses_to_launch_with_another_users_script(as_user, alice, bob, launchable):
    theirs = RolloutScriptVersionFactory(asset__owner=bob)
    response = as_user(alice).post(reverse("run-launch"), _launch_data(launchable, script_version=theirs.id))
    assert _errors(response, "script_version")
    assert not Run.objects.exists()


def test_it_prefills_launch_similar_from_a_run(as_user, alice, launchable):
    run = RunFactory(owner=alice, config={"group_size": 12, "train": {"learning_rate": 2e-5}}, name="orig")
    form = as_user(alice).get(reverse("run-launch"), {"from": run.id}).context["form"]
    assert form.initial["name"] == "orig (copy)" and form.initial["group_size"] == 12
    assert '"learning_rate": 2e-05' in form.initial["train"]


@pytest.mark.parametrize(
    "action, start, end",
    [
        ("cancel", "queued", "cancelled"),
        ("pause", "queued", "paused"),
        ("resume", "paused", "queued"),
        ("retry", "failed", "queued"),
    ],
)
def test_it_runs_actions_through_the_services(as_user, alice, action, start, end):
    run = RunFactory(owner=alice, status=start)
    response = as_user(alice).post(reverse("run-action", args=[run.id, action]))
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == end
    assert RunEvent.objects.filter(run=run, kind="status", actor=alice).exists()


def test_it_reports_a_refused_action(as_user, alice):
    run = RunFactory(owner=alice, status="completed")
    response = as_user(alice).post(reverse("run-action", args=[run.id, "pause"]), follow=True)
    assert "Only a queued or running run can be paused" in response.content.decode()
    assert as_user(alice).get(reverse("run-action", args=[run.id, "pause"])).status_code == 405


def test_it_registers_a_model_and_shows_errors_inline(as_user, alice, hub_model):
    hub_model("org/tiny")
    client = as_user(alice)
    response = client.post(reverse("model-list"), {"name": "tiny", "source": "org/tiny", "max_length": 512})
    assert response.status_code == 302
    assert PretrainedModel.objects.get(name="tiny").owner == alice
    response = client.post(reverse("model-list"), {"name": "tiny", "source": "org/other", "max_length": 512})
    assert _errors(response, "name") == ["already registered"]
    response = client.post(reverse("model-list"), {"name": "x", "source": "not an id!", "max_length": 512})
    assert _errors(response, "source") == ["not a Hugging Face model id"]
    # The field says what is wrong in short; the message on top says what to do about it.
    response = client.post(reverse("model-list"), {"name": "y", "source": "org/absent", "max_length": 512})
    assert _errors(response, "source") == ["not in this server's model cache"]
    top = [str(e) for e in response.context["form"].non_field_errors()]
    assert len(top) == 1 and "hf download org/absent" in top[0] and "register it again" in top[0]
    assert "hf download org/absent" in response.content.decode()


def test_it_refuses_a_server_directory_from_a_non_staff_user(as_user, alice, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    for source in (str(tmp_path), f"{tmp_path}/../{tmp_path.name}", "~/models", "./data"):
        data = {"name": "mine", "source": source, "max_length": 512}
        response = as_user(alice).post(reverse("model-list"), data)
        assert response.status_code == 200
        assert _errors(response, "source") == ["server paths need staff"]
    assert not PretrainedModel.objects.exists()


def test_staff_may_register_a_server_directory_on_the_form(as_user, staff, vllm_model_dir):
    data = {"name": "local", "source": str(vllm_model_dir), "max_length": 512}
    response = as_user(staff).post(reverse("model-list"), data)
    assert response.status_code == 302
    model = PretrainedModel.objects.get(name="local")
    assert model.owner == staff and model.local_path == str(vllm_model_dir.resolve())
    response = as_user(staff).post(reverse("model-list"), {"name": "x", "source": "/no/such/dir", "max_length": 512})
    assert _errors(response, "source") == ["not a model directory"]


def test_it_uploads_scenarios_and_shows_bad_lines_inline(as_user, alice):
    client = as_user(alice)
    bad = '{"prompt": "a"}\n{"prompt": \n[1, 2]\n'
    response = client.post(reverse("scenario-set-new"), {"name": "s", "content": bad, "validation_fraction": 0.2})
    errors = _errors(response, "file")
    assert any(e.startswith("line 2: not valid JSON") for e in errors)
    assert any(e.startswith("line 3: each line must be a JSON object") for e in errors)
    good = "\n".join(json.dumps({"prompt": f"p{i}", "split": "validation" if i == 0 else "train"}) for i in range(5))
    response = client.post(reverse("scenario-set-new"), {"name": "s", "content": good, "validation_fraction": 0.2})
    scenario_set = ScenarioSet.objects.get(name="s")
    assert response["Location"] == reverse("scenario-set-detail", args=[scenario_set.id])
    assert (scenario_set.train_count, scenario_set.validation_count) == (4, 1)


def test_it_asks_for_code_when_none_is_given(as_user, alice):
    response = as_user(alice).post(reverse("script-new"), {"name": "empty"})
    assert _errors(response, "content") == ["Choose a file or paste the code."]


def test_it_shows_syntax_errors_with_line_numbers(as_user, alice):
    broken = "import art\n\nasync def rollout(model, scenario)\n    return None\n"
    response = as_user(alice).post(reverse("script-new"), {"name": "broken", "content": broken})
    errors = _errors(response, "content")
    assert any("line 3" in e for e in errors), errors
    assert [line["number"] for line in response.context["error_lines"] if line.get("bad")] == [3]
    assert not RolloutScript.objects.exists()


def test_it_uploads_scripts_and_rewards_with_versions_and_diffs(as_user, alice):
    client = as_user(alice)
    response = client.post(reverse("script-new"), {"name": "agent", "content": SCRIPT})
    script = RolloutScript.objects.get(name="agent")
    assert response["Location"] == reverse("script-detail", args=[script.id])
    changed = SCRIPT.replace("reward=0.0", "reward=0.5")
    client.post(reverse("script-detail", args=[script.id]), {"content": changed, "note": "start at 0.5"})
    assert list(script.versions.values_list("number", flat=True).order_by("number")) == [1, 2]
    body = client.get(reverse("script-detail", args=[script.id])).content.decode()
    assert 'class="diff"' in body and "start at 0.5" in body
    response = client.post(reverse("reward-new"), {"name": "exact", "content": REWARD})
    assert response.status_code == 302


def test_it_queues_a_dry_run_and_shows_its_result(as_user, alice, django_capture_on_commit_callbacks):
    version = RolloutScriptVersionFactory(asset__owner=alice)
    scenario_set = ScenarioSetFactory(owner=alice)
    model = BaseModelFactory()
    client = as_user(alice)
    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post(
            reverse("dry-run-new"),
            {"script_version": version.id, "base_model": model.id, "scenario_set": scenario_set.id},
        )
    dry_run = DryRun.objects.get()
    assert response["Location"] == reverse("dry-run-detail", args=[dry_run.id])
    assert len(callbacks) == 1 and len(dry_run.scenarios) == 4
    body = client.get(response["Location"]).content.decode()
    assert 'id="dry-run-waiting"' in body and "dry_run.js" in body  # what it waits for (test_dry_run_waiting)
    assert client.get(reverse("dry-run-status", args=[dry_run.id])).json()["finished"] is False
    dry_run.status = "done"
    dry_run.result = [{"messages": [{"role": "assistant", "content": "w0!"}], "reward": 1.0}]
    dry_run.save()
    body = client.get(response["Location"]).content.decode()
    assert "w0!" in body and 'id="dry-run-waiting"' not in body


def test_a_server_directory_source_is_shown_to_staff_only(as_user, alice, staff):
    """The default model's source is its directory in the data dir: a host path, for staff eyes only, on the
    models page and in the API."""
    model = BaseModelFactory(name="default-ish", source="/srv/artweb/data/models/SmolLM2", local_path="")
    for user, shown in ((alice, "a directory on the server"), (staff, model.source)):
        page = as_user(user).get(reverse("model-list")).content.decode()
        assert shown in page and (user.is_staff or "/srv/artweb" not in page)
        api = as_user(user).get("/api/v1/base-models/").json()["results"]
        assert [m["source"] for m in api if m["name"] == "default-ish"] == [shown]
