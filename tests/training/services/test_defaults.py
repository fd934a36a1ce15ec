"""Defaults that learn: a base model's recommended training settings fill what a run leaves out, the
launch form preselects a script's companion reward and says what the chosen model recommends, and a
run whose groups carry no signal for several steps in a row warns once, with a link to examples."""

import json

import pytest
from django.core.management import call_command
from django.urls import reverse

from artweb.errors import ApplicationError
from artweb.testing.factories import (
    BaseModelFactory,
    RewardFunctionVersionFactory,
    RolloutScriptVersionFactory,
    RunFactory,
    ScenarioSetFactory,
    StepFactory,
    TrajectoryGroupFactory,
    UserFactory,
)
from rollouts.models import RolloutScript
from rollouts.services import script_companion_set
from training.analytics.alerts import run_alerts_check
from training.engine.default_model import RECOMMENDED_TRAIN
from training.services import base_model_recommend, base_model_register, run_create

NO_SIGNAL_STEPS = 3  # the default rule

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice():
    return UserFactory(username="alice")


def _launch(owner, model, **config):
    return run_create(
        owner=owner,
        name="r",
        base_model=model,
        config=config,
        script_version=RolloutScriptVersionFactory(asset__owner=owner),
        reward_version=RewardFunctionVersionFactory(asset__owner=owner),
        scenario_set=ScenarioSetFactory(owner=owner),
        start=False,
    )


# --- recommended settings --------------------------------------------------------------------------------


def test_a_models_recommendation_fills_the_train_settings_a_run_leaves_out(alice):
    model = BaseModelFactory(name="m", recommended_train={"learning_rate": 2e-4, "lora_rank": 16})
    run = _launch(alice, model, train={"lora_rank": 4})
    assert run.config["train"]["learning_rate"] == 2e-4  # the recommendation
    assert run.config["train"]["lora_rank"] == 4  # the person's own value wins
    assert run.config["train"]["lora_alpha"] == 16.0  # neither: artweb's default


def test_a_model_without_recommendations_takes_artwebs_defaults(alice):
    run = _launch(alice, BaseModelFactory(name="plain"))
    assert run.config["train"]["learning_rate"] == 5e-6


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ({"learning_rate": 7}, "learning_rate must be in"),
        ({"learnig_rate": 1e-4}, "unknown config key"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_recommendations_are_refused_naming_the_setting(bad, fragment):
    with pytest.raises(ApplicationError) as exc:
        base_model_register(name="x", source="org/x", recommended_train=bad)
    assert fragment in exc.value.message
    model = BaseModelFactory(name="y", recommended_train={"learning_rate": 1e-4})
    with pytest.raises(ApplicationError):
        base_model_recommend(model=model, train=bad)
    model.refresh_from_db()
    assert model.recommended_train == {"learning_rate": 1e-4}  # what was saved stays


# --- the launch form -----------------------------------------------------------------------------------


def test_the_demo_script_comes_with_its_reward_and_the_form_preselects_it(client):
    admin = UserFactory(username="root", is_staff=True, is_superuser=True)
    BaseModelFactory(name="SmolLM2-135M-Instruct", recommended_train=RECOMMENDED_TRAIN)
    call_command("seed_demo", owner="root")
    script = RolloutScript.objects.get(owner=admin, name="Example rollout")
    assert script.companion_reward.name == "Example reward"
    client.force_login(admin)
    page = client.get(reverse("run-launch"))
    form = page.context["form"]
    assert form.initial["reward_version"] == script.companion_reward.latest_version.id
    hints = json.loads(
        page.content.decode().split('id="launch-hints" type="application/json">')[1].split("</script>")[0]
    )
    assert hints["companions"] == {str(script.latest_version.id): script.companion_reward.latest_version.id}
    model_id = str(form.initial["base_model"])
    assert hints["recommended"][model_id]["train"] == RECOMMENDED_TRAIN


def test_launching_with_the_forms_defaults_trains_with_the_companion_reward(client):
    alice = UserFactory(username="al")
    BaseModelFactory(name="m", recommended_train={"learning_rate": 2e-4})
    version = RolloutScriptVersionFactory(
        asset__owner=alice,
        content=(
            "import art\n\nasync def rollout(model, scenario):\n    return art.Trajectory(messages_and_choices=[])\n"
        ),
    )
    reward = RewardFunctionVersionFactory(asset__owner=alice)
    script_companion_set(script=version.asset, reward=reward.asset)
    ScenarioSetFactory(owner=alice)
    client.force_login(alice)
    form = client.get(reverse("run-launch")).context["form"]
    data = {f.html_name: f.value() for f in form if f.value() not in (None, False)}
    data["name"] = "defaults"
    assert client.post(reverse("run-launch"), data).status_code == 302
    run = alice.runs.get()
    assert run.reward_version == reward and run.config["train"]["learning_rate"] == 2e-4


def test_a_companion_must_be_the_script_owners_own():
    version = RolloutScriptVersionFactory()
    stranger = RewardFunctionVersionFactory()
    with pytest.raises(ApplicationError, match="one of yours"):
        script_companion_set(script=version.asset, reward=stranger.asset)
    version.asset.refresh_from_db()
    assert version.asset.companion_reward is None


# --- no learning signal ----------------------------------------------------------------------------------


def _step(run, step, *, dead: bool, reward=0.0):
    StepFactory(
        run=run,
        step=step,
        reward_mean=reward,
        reward_std=0.0 if dead else 0.2,
        metrics={"groups": 4, "groups_no_signal": 4 if dead else 1},
    )
    TrajectoryGroupFactory(run=run, step=step, split="train", reward_mean=reward, reward_std=0.0 if dead else 0.2)


def test_a_run_warns_once_when_no_group_carried_signal_for_several_steps(client):
    run = RunFactory()
    _step(run, 1, dead=False)
    events = []
    for step in range(2, 2 + NO_SIGNAL_STEPS + 2):
        _step(run, step, dead=True)
        events.append(next(iter(run_alerts_check(run=run, step=step)), None))
    fired = [e for e in events if e is not None]
    assert len(fired) == 1 and events[NO_SIGNAL_STEPS - 1] is fired[0]  # when the streak reached its length
    warning = fired[0]
    assert warning.kind == "no_signal" and warning.data["level"] == "warning"
    assert warning.data["steps"] == [2, 3, 4]
    assert "steps 2-4" in warning.message and "every rollout scored 0" in warning.message
    assert len(warning.data["group_ids"]) == 3
    assert warning.data["link"] == reverse("run-trajectories", args=[run.id]) + "?step=4&split=train"
    client.force_login(run.owner)
    body = client.get(reverse("run-detail", args=[run.id])).content.decode()
    banner = body.split('id="run-warnings"')[1].split("</div>\n</div>")[0]
    assert "No learning signal in steps 2-4" in banner and "See examples" in banner


def test_a_step_with_signal_breaks_the_streak():
    run = RunFactory()
    for step, dead in enumerate([True, True, False, True, True], start=1):
        _step(run, step, dead=dead)
        assert run_alerts_check(run=run, step=step) == []
    _step(run, 6, dead=True)
    assert [e.kind for e in run_alerts_check(run=run, step=6)] == ["no_signal"]  # steps 4-6: a new streak


def test_a_companion_is_set_from_the_script_page(client):
    version = RolloutScriptVersionFactory()
    reward = RewardFunctionVersionFactory(asset__owner=version.asset.owner)
    client.force_login(version.asset.owner)
    page = client.get(reverse("script-detail", args=[version.asset_id])).content.decode()
    assert "Companion reward function" in page and reward.asset.name in page
    response = client.post(reverse("script-companion", args=[version.asset_id]), {"reward": reward.asset_id})
    assert response.status_code == 302
    version.asset.refresh_from_db()
    assert version.asset.companion_reward == reward.asset


def test_recommended_settings_are_registered_through_the_api_and_the_form(client, hub_model):
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    for repo_id in ("org/q", "org/q2", "org/q3"):
        hub_model(repo_id)
    user = UserFactory(username="reg")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    response = api.post(
        "/api/v1/base-models/register/",
        {"name": "q", "source": "org/q", "recommended_train": {"learning_rate": 1e-4}},
        format="json",
    )
    assert response.status_code == 201, response.json()
    assert response.json()["recommended_train"] == {"learning_rate": 1e-4}
    bad = api.post(
        "/api/v1/base-models/register/",
        {"name": "q2", "source": "org/q2", "recommended_train": {"learning_rate": 3}},
        format="json",
    )
    assert bad.status_code == 400 and "learning_rate" in bad.json()["message"]
    client.force_login(user)
    page = client.post(
        reverse("model-list"),
        {"name": "q3", "source": "org/q3", "max_length": 2048, "recommended_train": '{"lora_rank": 16}'},
    )
    assert page.status_code == 302
    assert "lora_rank" in client.get(reverse("model-list")).content.decode()
