"""Alert rules: each fires on a run that has its pathology, once per streak, with examples and a link, and
stays silent on a healthy run of the shipped example; the rules are edited per run from the page and API."""

import json
from pathlib import Path

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from artweb.testing.factories import RunFactory, StepFactory, TrajectoryFactory, TrajectoryGroupFactory
from training.analytics.alerts import RULES, run_alerts_check
from training.config import AlertRules
from training.models import Run, RunEvent, Step

pytestmark = pytest.mark.django_db

HEALTHY = Path(__file__).resolve().parents[1] / "fixtures" / "example_run_steps.json"


def _steps(run, rows):
    """Steps 1..n with the given metrics (and their train groups), checking the rules after each commit as
    the worker does; returns the events raised, by step."""
    raised = {}
    for step, row in enumerate(rows, start=1):
        row = dict(row)
        StepFactory(
            run=run,
            step=step,
            reward_mean=row.pop("reward_mean", 0.5),
            reward_std=row.pop("reward_std", 0.2),
            val_reward=row.pop("val_reward", None),
            metrics=row,
        )
        group = TrajectoryGroupFactory(run=run, step=step, split="train")
        for i in range(3):
            TrajectoryFactory(
                group=group,
                run=run,
                step=step,
                index=i,
                completion_tokens=10 * (i + 1),
                truncated=i == 2,
                search_text=row.get("answer_repeat_text", f"answer {i}"),
            )
        raised[step] = [e.kind for e in run_alerts_check(run=run, step=step)]
    return raised


def test_all_equal_rewards_raise_no_signal_with_example_groups():
    run = RunFactory()
    raised = _steps(run, [{"groups": 4, "groups_no_signal": 4, "reward_mean": 0.0, "reward_std": 0.0}] * 5)
    assert raised == {1: [], 2: [], 3: ["no_signal"], 4: [], 5: []}
    event = RunEvent.objects.get(run=run, kind="no_signal")
    assert event.data["level"] == "warning" and event.data["steps"] == [1, 2, 3]
    assert "every rollout scored 0" in event.message and len(event.data["group_ids"]) == 3


def test_rising_train_and_falling_held_out_reward_raise_divergence():
    run = RunFactory()
    rows = []
    for step in range(1, 17):
        row = {"reward_mean": 0.3 + 0.04 * step}
        if step % 4 == 0:
            row["val_reward"] = 0.8 - 0.1 * (step // 4)
        rows.append(row)
    raised = _steps(run, rows)
    fired = [s for s, kinds in raised.items() if "alert_heldout_divergence" in kinds]
    assert fired == [16]  # the fourth validation closes three falling intervals while train rose
    event = RunEvent.objects.get(run=run, kind="alert_heldout_divergence")
    assert event.data["steps"] == [4, 8, 12, 16]
    assert event.data["link"] == reverse("run-trajectories", args=[run.id]) + "?step=16&split=validation"
    assert "0.700 → 0.400" in event.message


def test_held_out_reward_that_rises_with_train_is_silent():
    run = RunFactory()
    rows = [
        {"reward_mean": 0.3 + 0.04 * s, **({"val_reward": 0.3 + 0.05 * s} if s % 4 == 0 else {})} for s in range(1, 17)
    ]
    assert not any("alert_heldout_divergence" in k for k in _steps(run, rows).values())


def test_completion_length_drift_names_the_longest_answers():
    run = RunFactory()
    lengths = [20, 21, 19, 30, 40, 50, 60, 70]
    raised = _steps(run, [{"completion_tokens_mean": n} for n in lengths])
    fired = [s for s, kinds in raised.items() if "alert_length_drift" in kinds]
    assert fired == [7]  # steps 5-7 average 50 tokens against 20 at steps 1-3: more than 2x
    event = RunEvent.objects.get(run=run, kind="alert_length_drift")
    assert "grew from 20.0 tokens" in event.message and "no validation" in event.message
    longest = Step.objects.get(run=run, step=7)
    assert (
        event.data["trajectory_ids"][0]
        == run.trajectories.filter(step=longest.step).order_by("-completion_tokens").first().id
    )


def test_a_length_change_that_comes_with_a_better_held_out_reward_is_learning():
    run = RunFactory()
    rows = [
        {"completion_tokens_mean": n, **({"val_reward": v} if v is not None else {})}
        for n, v in [(30, 0.3), (29, None), (28, None), (20, 0.4), (14, None), (13, None), (12, 0.6)]
    ]
    assert not any("alert_length_drift" in kinds for kinds in _steps(run, rows).values())
    run = RunFactory()
    rows[-1]["val_reward"] = 0.2  # the same drift, with the held-out reward falling: warned
    assert [s for s, kinds in _steps(run, rows).items() if "alert_length_drift" in kinds] == [7]
    assert "did not improve (0.300 → 0.200)" in RunEvent.objects.get(run=run, kind="alert_length_drift").message


def test_flat_reward_entropy_collapse_and_truncation():
    run = RunFactory(config={"alerts": {"flat_reward_steps": 4, "flat_reward_delta": 0.02}})
    rows = [
        {"reward_mean": 0.5, "entropy": 1.2, "truncation_rate": 0.1},
        {"reward_mean": 0.505, "entropy": 0.9, "truncation_rate": 0.2},
        {"reward_mean": 0.51, "entropy": 0.5, "truncation_rate": 0.8},
        {"reward_mean": 0.5, "entropy": 0.1, "truncation_rate": 0.9},
    ]
    raised = _steps(run, rows)
    assert raised[3] == ["alert_truncation"]
    assert sorted(raised[4]) == ["alert_entropy_collapse", "alert_reward_flat"]
    trunc = RunEvent.objects.get(run=run, kind="alert_truncation")
    assert "80% of step 3's rollouts stopped at max_tokens" in trunc.message
    assert set(run.trajectories.filter(id__in=trunc.data["trajectory_ids"]).values_list("truncated", flat=True)) == {
        True
    }


def test_a_step_that_trained_no_token_is_no_entropy_collapse():
    """A step whose groups all scored alike trains nothing, so it has no entropy: neither as the baseline
    (a first step) nor as the latest value. Rows as the trainer wrote them before it said so (0.0) and as
    it writes them now (no entropy at all)."""
    for untrained in ({"tokens_trained": 0, "entropy": 0.0}, {"tokens_trained": 0}):
        run = RunFactory()
        rows = [
            untrained,
            {"tokens_trained": 120, "entropy": 2.74},
            {"tokens_trained": 118, "entropy": 2.73},
            untrained,
            {"tokens_trained": 125, "entropy": 2.83},
        ]
        assert not any("alert_entropy_collapse" in kinds for kinds in _steps(run, rows).values()), untrained
    run = RunFactory()  # a real collapse among such steps is still seen, from the first trained step
    rows = [{"tokens_trained": 0, "entropy": 0.0}, {"tokens_trained": 100, "entropy": 2.0}]
    rows += [{"tokens_trained": 0, "entropy": 0.0}, {"tokens_trained": 90, "entropy": 0.1}]
    assert [s for s, kinds in _steps(run, rows).items() if "alert_entropy_collapse" in kinds] == [4]
    assert (
        "fell to 0.1, from 2 at the first step" in RunEvent.objects.get(run=run, kind="alert_entropy_collapse").message
    )


def test_one_component_carrying_the_reward_and_a_repeated_answer():
    run = RunFactory()
    raised = _steps(
        run,
        [
            {
                "component_top": "format",
                "component_top_share": 0.5,
                "answer_repeat_share": 0.25,
                "answer_repeat_text": "42",
            },
            {
                "component_top": "format",
                "component_top_share": 0.93,
                "answer_repeat_share": 0.75,
                "answer_repeat_text": "42",
            },
        ],
    )
    assert sorted(raised[2]) == ["alert_component_dominance", "alert_repeated_answer"]
    repeated = RunEvent.objects.get(run=run, kind="alert_repeated_answer")
    assert "75% of step 2's scenarios" in repeated.message and "q=42" in repeated.data["link"]


def test_pause_on_alert_pauses_the_run():
    run = RunFactory(status=Run.Status.QUEUED, config={"alerts": {"pause_on_alert": True}})
    _steps(run, [{"truncation_rate": 0.9}])
    run.refresh_from_db()
    assert run.status == Run.Status.PAUSED


def test_a_rule_set_to_zero_is_off():
    run = RunFactory(config={"alerts": {"no_signal_steps": 0}})
    raised = _steps(run, [{"groups": 4, "groups_no_signal": 4}] * 4)
    assert not any(raised.values())


def test_the_shipped_examples_healthy_run_raises_no_alert():
    """Steps recorded from a real 20-step run of the shipped example with the launch form's defaults
    (python -m bench.alerts_healthy): every rule, evaluated at every step, stays silent."""
    recorded = json.loads(HEALTHY.read_text())
    assert recorded["status"] == "completed" and len(recorded["steps"]) == 20
    run = RunFactory(config=recorded["config"])
    rules = AlertRules.model_validate(recorded["config"].get("alerts", {}))
    rows = [
        Step(
            run=run,
            step=s["step"],
            reward_mean=s["reward_mean"],
            reward_std=s["reward_std"],
            val_reward=s["val_reward"],
            metrics=s["metrics"],
        )
        for s in recorded["steps"]
    ]
    fired = {name: [r.step for i, r in enumerate(rows) if rule(rules, rows[: i + 1])] for name, rule in RULES.items()}
    assert {name: steps for name, steps in fired.items() if steps} == {}
    assert rows[-1].metrics["reward_mean"] > rows[0].metrics["reward_mean"]  # it did learn


def test_rules_are_edited_from_the_run_page(client):
    run = RunFactory()
    client.force_login(run.owner)
    page = client.get(reverse("run-detail", args=[run.id])).content.decode()
    assert 'id="alerts-form"' in page and 'name="no_signal_steps"' in page
    response = client.post(
        reverse("run-alerts", args=[run.id]),
        {
            "no_signal_steps": "5",
            "flat_reward_steps": "",
            "truncation_share": "0.9",
            "reward_components": "fmt, ok",
            "pause_on_alert": "on",
        },
        follow=True,
    )
    assert "Alert rules saved" in response.content.decode()
    run.refresh_from_db()
    alerts = run.config["alerts"]
    assert alerts["no_signal_steps"] == 5 and alerts["flat_reward_steps"] == 10 and alerts["truncation_share"] == 0.9
    assert alerts["reward_components"] == ["fmt", "ok"] and alerts["pause_on_alert"] is True
    assert RunEvent.objects.filter(run=run, kind="alert_rules_changed").exists()

    response = client.post(reverse("run-alerts", args=[run.id]), {"truncation_share": "3"}, follow=True)
    assert "Alert rules not saved: truncation_share" in response.content.decode()
    run.refresh_from_db()
    assert run.config["alerts"]["truncation_share"] == 0.9  # nothing lost


def test_rules_are_read_and_changed_through_the_api(alice, bob):
    run = RunFactory(owner=alice)
    api_client = APIClient()
    api_client.force_authenticate(alice)
    url = reverse("api-run-alerts", args=[run.id])
    assert api_client.get(url).json()["alerts"]["no_signal_steps"] == 3
    response = api_client.patch(url, {"length_drift": 4}, format="json")
    assert response.status_code == 200 and response.json()["alerts"]["length_drift"] == 4
    response = api_client.patch(url, {"length_drift": -1, "bogus": 1}, format="json")
    assert response.status_code == 400
    assert set(response.json()["field_errors"]) == {"length_drift", "bogus"}
    api_client.force_authenticate(bob)
    assert api_client.get(url).status_code == 404
