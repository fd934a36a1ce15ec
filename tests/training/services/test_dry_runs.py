"""Dry runs with several samples per scenario: "score the base model's answers" before a launch.

The service and its two doors (the form, the API) bound `samples` and `scenario_count`; the spread
summary says per scenario whether the reward told its answers apart, by the trainer's own rule. The
summary is checked on hand-made records, on a real jailed sandbox batch, and through the dry-run task
against the session's real vLLM server (marked vllm).
"""

import json
from unittest import mock

import pytest
from django.urls import reverse

from artweb.errors import ApplicationError
from artweb.testing.factories import (
    BaseModelFactory,
    RewardFunctionVersionFactory,
    RolloutScriptVersionFactory,
    ScenarioSetFactory,
)
from rollouts.sandbox.rollouts import dry_run
from tests.api.conftest import token_client
from training.models import DryRun
from training.services.dry_runs import MAX_DRY_RUN_ROLLOUTS, dry_run_create, dry_run_spread

NO_SERVER = "http://127.0.0.1:9/v1"  # nothing listens here: for a script that never calls the model

# Scores the answer at random for "spread" scenarios (two draws are never equal), the same for "flat"
# ones, and raises for "broken" ones: one scenario of each kind of verdict.
SPREAD_REWARD = """import random


def reward(trajectory, scenario):
    if scenario["kind"] == "broken":
        raise KeyError("answer")
    if scenario["kind"] == "flat":
        return 0.5
    return random.random()
"""

# Never calls the model: for the sandbox test, which runs without an inference server.
OFFLINE_SCRIPT = """import art


async def rollout(model, scenario):
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": scenario["prompt"]},
                                                {"role": "assistant", "content": "an answer"}], reward=0.0)
"""

SCENARIOS = [
    {"kind": "spread", "prompt": "Say the word red."},
    {"kind": "flat", "prompt": "Say the word blue."},
    {"kind": "broken", "prompt": "Say the word green."},
]


@pytest.fixture
def enqueued():
    """The GPU worker's message is recorded instead of sent (no worker in these tests)."""
    with (
        mock.patch("artweb.dispatch.transaction.on_commit", side_effect=lambda send: send()),
        mock.patch("training.tasks.dry_run_task.apply_async") as send,
    ):
        yield send


@pytest.fixture
def assets(alice):
    return {
        "script": RolloutScriptVersionFactory(asset__owner=alice, asset__name="agent"),
        "reward": RewardFunctionVersionFactory(asset__owner=alice, asset__name="judge"),
        "scenario_set": ScenarioSetFactory(owner=alice, name="words"),
        "base_model": BaseModelFactory(),
    }


# --- the service ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_queues_samples_rollouts_of_the_first_scenarios(alice, assets, enqueued):
    dry = dry_run_create(
        owner=alice,
        script_version=assets["script"],
        reward_version=assets["reward"],
        base_model=assets["base_model"],
        scenario_set=assets["scenario_set"],
        scenario_count=5,
        samples=4,
    )
    dry.refresh_from_db()
    assert dry.samples == 4 and [s["answer"] for s in dry.scenarios] == ["w0", "w1", "w2", "w3", "w4"]
    enqueued.assert_called_once_with(args=(dry.id,), kwargs={})


@pytest.mark.django_db
@pytest.mark.parametrize(
    "kwargs, field, words",
    [
        ({"samples": 0}, "samples", "from 1 to 16"),
        ({"samples": 17}, "samples", "from 1 to 16"),
        ({"samples": True}, "samples", "whole number"),
        ({"samples": "4"}, "samples", "whole number"),
        ({"scenario_count": 9}, "scenario_count", "from 1 to 8"),
        # The set has 6 scenarios: asking for 8 takes 6.
        ({"scenario_count": 8, "samples": 11}, "samples", "6 scenarios x 11 samples is 66 rollouts"),
        ({"scenarios": [{"i": i} for i in range(9)], "scenario_set": None}, "scenarios", "at most 8 scenarios"),
    ],
)
def test_it_refuses_samples_and_counts_out_of_bounds(alice, assets, enqueued, kwargs, field, words):
    base = {
        "owner": alice,
        "script_version": assets["script"],
        "base_model": assets["base_model"],
        "scenario_set": assets["scenario_set"],
    }
    with pytest.raises(ApplicationError) as caught:
        dry_run_create(**{**base, **kwargs})
    assert list(caught.value.field_errors) == [field] and words in caught.value.message
    assert caught.value.field_errors[field] == [caught.value.message]
    assert not DryRun.objects.exists()
    enqueued.assert_not_called()


# --- the API and the form -------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_api_takes_samples_and_says_which_field_is_wrong(alice, assets, enqueued, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "EXCEPTION_HANDLER": "artweb.api_errors.exception_handler"}
    api = token_client(alice)
    body = {"script": "agent", "reward": "judge", "base_model": assets["base_model"].id, "scenario_set": "words"}
    created = api.post("/api/v1/dry-runs/create/", {**body, "samples": 4, "scenario_count": 8}, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["samples"] == 4 and len(created.json()["scenarios"]) == 6  # the set has 6

    for bad, field in [
        ({"samples": 17}, "samples"),
        ({"samples": 0}, "samples"),
        ({"scenario_count": 9}, "scenario_count"),
        ({"samples": "many"}, "samples"),
    ]:
        response = api.post("/api/v1/dry-runs/create/", {**body, **bad}, format="json")
        assert response.status_code == 400 and field in response.json()["field_errors"], (bad, response.json())
    too_many = api.post("/api/v1/dry-runs/create/", {**body, "scenario_count": 8, "samples": 16}, format="json")
    assert too_many.status_code == 400
    assert f"a dry run does at most {MAX_DRY_RUN_ROLLOUTS}" in too_many.json()["field_errors"]["samples"][0]
    assert DryRun.objects.count() == 1


@pytest.mark.django_db
def test_the_form_shows_a_bad_sample_count_under_its_field_and_keeps_the_rest(client, alice, assets, enqueued):
    client.force_login(alice)
    form = {
        "script_version": assets["script"].id,
        "reward_version": assets["reward"].id,
        "base_model": assets["base_model"].id,
        "scenario_set": assets["scenario_set"].id,
        "scenario_count": 8,
    }
    response = client.post(reverse("dry-run-new"), {**form, "samples": 17})
    assert response.status_code == 400
    page = response.content.decode()
    assert "Give 1 to 16 samples per scenario." in page and 'id="id_samples_errors"' in page
    assert 'name="samples" value="17"' in page  # what the person typed stays, to correct

    response = client.post(reverse("dry-run-new"), {**form, "samples": 11})
    assert response.status_code == 400
    assert "6 scenarios x 11 samples is 66 rollouts" in response.content.decode()
    assert not DryRun.objects.exists()

    response = client.post(reverse("dry-run-new"), {**form, "samples": 4})
    dry = DryRun.objects.get()
    assert response["Location"] == reverse("dry-run-detail", args=[dry.id]) and dry.samples == 4


@pytest.mark.django_db
def test_a_link_opens_the_form_prefilled(client, alice, assets):
    client.force_login(alice)
    query = (
        f"?script_version={assets['script'].id}&reward_version={assets['reward'].id}"
        f"&scenario_set={assets['scenario_set'].id}&samples=4&scenario_count=8&samples_extra=x"
    )
    response = client.get(reverse("dry-run-new") + query)
    assert response.status_code == 200
    form = response.context["dry_run_form"]
    assert {
        name: form[name].value()
        for name in ("script_version", "reward_version", "scenario_set", "samples", "scenario_count")
    } == {
        "script_version": assets["script"].id,
        "reward_version": assets["reward"].id,
        "scenario_set": assets["scenario_set"].id,
        "samples": 4,
        "scenario_count": 8,
    }
    assert not DryRun.objects.exists()  # opening the form queues nothing


# --- the spread summary ---------------------------------------------------------------------------


def _records(rows, error="failed"):
    """Records of rewards per scenario; None is a rollout that failed with `error` (None: no error, the
    reward gave None)."""
    return [
        {"scenario_index": i, "reward": r, "error": None if r is not None else error}
        for i, rewards in enumerate(rows)
        for r in rewards
    ]


REWARD_RAISED = "The reward function failed: KeyError: 'answer'"  # as the sandbox words it
REWARD_TIMED_OUT = "Timed out: the reward did not finish within 20 s (wall clock)."


def test_the_summary_follows_the_trainers_rule_for_signal():
    summary = dry_run_spread(
        _records([[1.0, 0.0, 0.5, 0.5], [0.3, 0.3, 0.3, 0.3], [None, 0.2, None, 0.2], [None, 0.9, None, None]]),
        scenario_count=4,
    )
    rows = summary["scenarios"]
    assert [r["signal"] for r in rows] == [True, False, False, False]
    # [1, 0, .5, .5]: mean .5, population std sqrt((.25 + .25 + 0 + 0) / 4) = sqrt(.125).
    assert rows[0]["std"] == pytest.approx(0.125**0.5) and (rows[0]["min"], rows[0]["max"]) == (0.0, 1.0)
    assert rows[1]["std"] == pytest.approx(0.0)
    assert rows[2]["errors"] == 2 and rows[2]["rewards"] == [None, 0.2, None, 0.2]
    assert rows[3]["std"] == 0.0 and rows[3]["min"] == rows[3]["max"] == 0.9  # one scored answer: nothing to compare
    assert summary["with_spread"] == 1 and summary["samples"] == 4
    assert summary["message"].startswith("This reward gives spread on 1 of 4 scenarios")


@pytest.mark.parametrize(
    "rows, start, level",
    [
        ([[1.0, 0.0], [0.2, 0.4]], "This reward gives spread on all 2 scenarios", "success"),
        (
            [[1.0, 1.0], [0.0, 0.0]],
            "No scenario got different rewards: GRPO would have nothing to learn from",
            "warning",
        ),
        ([[None, None], [None, None]], "No rollout was scored: all 4 failed; each one's error is below", "error"),
        ([[None], [None]], "No rollout was scored: all 2 failed", "error"),  # one sample each, all failed
        ([[1.0], [0.0]], "One rollout per scenario shows no spread", ""),
    ],
)
def test_the_verdict_says_what_the_sample_means(rows, start, level):
    summary = dry_run_spread(_records(rows), scenario_count=len(rows))
    assert summary["message"].startswith(start) and summary["level"] == level


@pytest.mark.parametrize("error", [REWARD_RAISED, REWARD_TIMED_OUT])
def test_the_verdict_says_the_reward_failed_on_every_answer_not_that_rewards_were_equal(error):
    summary = dry_run_spread(_records([[None, None], [None, None]], error=error), scenario_count=2)
    assert summary["message"] == (
        "The reward function failed on all 4 answers, so no reward could be compared and GRPO would have "
        "nothing to learn from. Each answer's error is below: fix the reward function (a reward must be a "
        "finite number) and dry run again before launching."
    )
    assert (summary["failed"], summary["reward_failed"]) == (4, 4)
    assert "different rewards" not in summary["message"]


def test_the_verdict_blames_failures_not_the_reward_when_they_left_nothing_to_compare():
    # One scored answer per scenario, the other's reward raised: no spread, because of the failures.
    summary = dry_run_spread(_records([[0.0, None], [1.0, None]], error=REWARD_RAISED), scenario_count=2)
    assert summary["message"] == (
        "No scenario got two different rewards, and 2 of 4 rollouts failed, all in the reward function: fix "
        "those errors first (each one's is below), then dry run again."
    )
    mixed = _records([[None, None]], error=REWARD_RAISED) + _records([[], [None, None]], error="ValueError: boom")
    assert dry_run_spread(mixed, scenario_count=2)["message"].startswith(
        "No rollout was scored: all 4 failed (2 in the reward function, the others in the script)"
    )
    partial = dry_run_spread(_records([[1.0, 0.0, None], [0.5, 0.5, 0.5]], error=REWARD_RAISED), scenario_count=2)
    assert partial["message"].endswith(
        "teach nothing. 1 of 6 rollouts failed, all in the reward function: see each one's error below."
    )


def test_the_verdict_says_when_the_reward_scored_nothing_without_an_error():
    summary = dry_run_spread(_records([[None, None], [None, None]], error=None), scenario_count=2)
    assert summary["message"].startswith("No answer got a reward: the reward gave None (not scored) for every one.")
    assert [r["scored"] for r in summary["scenarios"]] == [0, 0] and summary["failed"] == 0


@pytest.mark.django_db
def test_the_page_says_the_reward_failed_and_marks_each_scenario_failed(client, alice, assets):
    records = _records([[None, None], [None, None]], error=REWARD_RAISED)
    result = {"trajectories": records, "spread": dry_run_spread(records, scenario_count=2)}
    dry = DryRun.objects.create(
        owner=alice,
        script_version=assets["script"],
        reward_version=assets["reward"],
        base_model=assets["base_model"],
        scenarios=[{"prompt": "a"}, {"prompt": "b"}],
        samples=2,
        status="done",
        result=result,
    )
    client.force_login(alice)
    page = client.get(reverse("dry-run-detail", args=[dry.id])).content.decode()
    assert "The reward function failed on all 4 answers" in page and "different rewards" not in page
    assert page.count("<strong>no</strong>: all failed") == 2 and "all equal" not in page


def test_the_summary_of_a_real_sandbox_batch():
    """The sandbox runs OFFLINE_SCRIPT (it never calls the model, so no inference server is needed) in
    the jail, 4 rollouts per scenario as one group each, and SPREAD_REWARD scores them there."""
    result = dry_run(
        script=OFFLINE_SCRIPT,
        reward=SPREAD_REWARD,
        scenarios=SCENARIOS,
        max_scenarios=3,
        group_size=4,
        base_url=NO_SERVER,
        model_name="none",
        timeout_s=60,
    )
    summary = dry_run_spread(result["trajectories"], scenario_count=3)
    spread, flat, broken = summary["scenarios"]
    assert len(spread["rewards"]) == 4 and len(set(spread["rewards"])) == 4 and spread["signal"]
    assert 0 <= spread["min"] < spread["max"] < 1 and spread["std"] > 0
    assert flat["rewards"] == [0.5] * 4 and flat["std"] == 0.0 and not flat["signal"]
    assert broken["rewards"] == [None] * 4 and broken["errors"] == 4 and not broken["signal"]
    assert all(
        t["error"].startswith("The reward function failed: KeyError")
        for t in result["trajectories"]
        if t["scenario_index"] == 2
    )
    assert summary["with_spread"] == 1
    assert summary["message"].startswith("This reward gives spread on 1 of 3 scenarios")


# --- the task, against the real base model ---------------------------------------------------------


@pytest.mark.vllm
@pytest.mark.django_db
def test_the_task_scores_the_base_models_answers(vllm_server, vllm_model_dir, alice, client, monkeypatch):
    """The dry-run task as a GPU worker runs it: the worker's inference server is the session's real vLLM
    server (set as the one the worker already started), the script asks the base model, the jailed
    reward scores each answer."""
    from training.services import inference
    from training.tasks import dry_run_task

    model = BaseModelFactory(name="smollm-local", local_path=str(vllm_model_dir))
    monkeypatch.setattr(inference, "_server", vllm_server)
    monkeypatch.setattr(inference, "_server_model", inference._served_as(model))
    dry = DryRun.objects.create(
        owner=alice,
        script_version=RolloutScriptVersionFactory(asset__owner=alice),
        reward_version=RewardFunctionVersionFactory(asset__owner=alice, content=SPREAD_REWARD),
        base_model=model,
        scenarios=SCENARIOS,
        samples=4,
    )

    dry_run_task.apply(args=(dry.id,)).get()

    dry.refresh_from_db()
    assert dry.status == "done", dry.error
    trajectories = dry.result["trajectories"]
    assert [t["scenario_index"] for t in trajectories] == [0] * 4 + [1] * 4 + [2] * 4
    answers = [t["messages"][-1] for t in trajectories if t["scenario_index"] == 0]
    assert all(m["role"] == "assistant" and m["token_ids"] for m in answers)  # the base model's own answers
    spread = dry.result["spread"]
    assert [row["signal"] for row in spread["scenarios"]] == [True, False, False]
    assert spread["scenarios"][1]["rewards"] == [0.5] * 4 and spread["scenarios"][2]["errors"] == 4
    assert spread["message"].startswith("This reward gives spread on 1 of 3 scenarios")
    json.dumps(dry.result)  # stored as JSON as it is
    stages = list(dry.events.filter(kind="stage").values_list("message", flat=True))
    assert stages[0].startswith("Starting the inference server for smollm-local")
    assert stages[1] == "Rolling out 3 scenarios x 4 against smollm-local in the sandbox."

    client.force_login(alice)
    page = client.get(reverse("dry-run-detail", args=[dry.id])).content.decode()
    assert "This reward gives spread on 1 of 3 scenarios" in page
    assert 'data-scenario="1" data-signal="no"' in page and 'data-scenario="0" data-signal="yes"' in page
