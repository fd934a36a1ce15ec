"""The reward-health panel's figures: errors by stage and type, reward latency, the slowest rewards.

Seeded trajectories with hand-picked reward times and errors (as the sandbox words them); every number
asserted here is worked out by hand in the comments, with PostgreSQL's percentile_cont (linear
interpolation between the two nearest ranks).
"""

import sys
from pathlib import Path

import pytest
from django.urls import reverse

from artweb.testing.factories import RunFactory, TrajectoryFactory, TrajectoryGroupFactory
from tests.api.conftest import token_client
from training.analytics.reward_health import SLOWEST_SHOWN, run_reward_health

pytestmark = pytest.mark.django_db

TRACE = '\n\nTraceback (your code, most recent call last):\n  File "reward.py", line 3, in reward\n'
ZERO_DIV = "The reward function failed: ZeroDivisionError: division by zero" + TRACE
ZERO_DIV_FLOAT = "The reward function failed: ZeroDivisionError: float division by zero" + TRACE
KEY_ERROR = "The reward function failed: KeyError: 'answer'" + TRACE
REWARD_TIMEOUT = "Timed out: the reward did not finish within 20 s (wall clock)."
GROUP_TIMEOUT = "Timed out: score_group did not finish within 30 s (wall clock)."
ROLLOUT_TIMEOUT = "Timed out: the rollout did not finish within 20 s (wall clock)."
ROLLOUT_RAISED = "ValueError: no answer in the completion\n\nTraceback (your code, most recent call last):\n"


def _trajectories(group, rows):
    """rows: (reward_ms, error) per trajectory of the group, in index order."""
    return [
        TrajectoryFactory(group=group, index=i, reward_ms=ms, error=error, reward=None if error else 1.0)
        for i, (ms, error) in enumerate(rows)
    ]


@pytest.fixture
def seeded(alice):
    run = RunFactory(owner=alice, status="running")
    step1 = _trajectories(TrajectoryGroupFactory(run=run, step=1), [(10, ""), (20, ""), (30, ZERO_DIV), (40, "")])
    step2 = _trajectories(
        TrajectoryGroupFactory(run=run, step=2),
        [(100, ""), (None, ROLLOUT_TIMEOUT), (50, ZERO_DIV_FLOAT), (200, REWARD_TIMEOUT)],
    )
    step3 = _trajectories(
        TrajectoryGroupFactory(run=run, step=3, failed_attempt=True),
        [(5, KEY_ERROR), (7, GROUP_TIMEOUT), (None, ROLLOUT_RAISED)],
    )
    return run, step1, step2, step3


def test_it_groups_errors_by_stage_and_type_with_the_first_as_example(seeded):
    run, step1, _, step3 = seeded
    errors = run_reward_health(run=run)["errors"]
    assert [(e["stage"], e["type"], e["count"]) for e in errors] == [
        # Reward errors first, the most frequent first; both ZeroDivisionErrors are one kind.
        ("reward", "ZeroDivisionError", 2),
        ("reward", "KeyError", 1),
        # Timeouts of the reward (per trajectory and per group), numbers folded to N.
        ("timeout", "Timed out: score_group did not finish within N s (wall clock).", 1),
        ("timeout", "Timed out: the reward did not finish within N s (wall clock).", 1),
        # Everything else happened before a reward could run.
        ("rollout", "Timed out: the rollout did not finish within N s (wall clock).", 1),
        ("rollout", "ValueError", 1),
    ]
    example = errors[0]["example"]
    assert example["trajectory"] == step1[2].id and example["step"] == 1
    assert example["message"] == ZERO_DIV
    assert example["link"] == f"/runs/{run.id}/trajectories/?step=1&traj={step1[2].id}"
    assert errors[5]["example"]["trajectory"] == step3[2].id


def test_it_computes_reward_latency_overall_and_per_step(seeded):
    run, *_ = seeded
    health = run_reward_health(run=run)
    assert health["trajectories"] == 11 and health["reward_timed"] == 9
    # All reward times sorted: 5 7 10 20 30 40 50 100 200 (n=9). p50 at rank 4 = 30; p95 at rank 7.6 =
    # 100 + 0.6 * (200 - 100) = 160.
    assert health["latency"] == {"p50_ms": 30.0, "p95_ms": 160.0, "max_ms": 200.0}
    assert health["per_step"] == [
        # 10 20 30 40: p50 at rank 1.5 = 25; p95 at rank 2.85 = 30 + 0.85 * 10 = 38.5. One reward error in 4.
        {
            "step": 1,
            "trajectories": 4,
            "reward_errors": 1,
            "reward_error_share": 0.25,
            "p50_ms": 25.0,
            "p95_ms": 38.5,
            "max_ms": 40.0,
        },
        # 50 100 200: p95 at rank 1.9 = 100 + 0.9 * 100 = 190. A reward error and a reward timeout in 4
        # (the rollout timeout is not the reward's).
        {
            "step": 2,
            "trajectories": 4,
            "reward_errors": 2,
            "reward_error_share": 0.5,
            "p50_ms": 100.0,
            "p95_ms": 190.0,
            "max_ms": 200.0,
        },
        # 5 7: p50 6, p95 at rank 0.95 = 5 + 0.95 * 2 = 6.9. KeyError and score_group's timeout in 3.
        {
            "step": 3,
            "trajectories": 3,
            "reward_errors": 2,
            "reward_error_share": 2 / 3,
            "p50_ms": 6.0,
            "p95_ms": 6.9,
            "max_ms": 7.0,
        },
    ]


def test_it_lists_the_slowest_rewards_first_with_links(seeded):
    run, _, step2, _ = seeded
    slowest = run_reward_health(run=run)["slowest"]
    assert [(t["reward_ms"], t["step"]) for t in slowest] == [
        (200, 2),
        (100, 2),
        (50, 2),
        (40, 1),
        (30, 1),
        (20, 1),
        (10, 1),
        (7, 3),
        (5, 3),
    ]
    assert slowest[0] == {
        "trajectory": step2[3].id,
        "step": 2,
        "reward_ms": 200,
        "reward": None,
        "error": REWARD_TIMEOUT,
        "link": f"/runs/{run.id}/trajectories/?step=2&traj={step2[3].id}",
    }


def test_it_shows_at_most_the_ten_slowest(alice):
    run = RunFactory(owner=alice)
    _trajectories(TrajectoryGroupFactory(run=run, step=1), [(ms, "") for ms in range(1, 13)])
    slowest = run_reward_health(run=run)["slowest"]
    assert SLOWEST_SHOWN == 10 and [t["reward_ms"] for t in slowest] == list(range(12, 2, -1))


def test_it_narrows_to_a_step_range(seeded):
    run, *_ = seeded
    health = run_reward_health(run=run, step_from=2, step_to=2)
    assert health["trajectories"] == 4 and [s["step"] for s in health["per_step"]] == [2]
    assert health["latency"] == {"p50_ms": 100.0, "p95_ms": 190.0, "max_ms": 200.0}
    assert {(e["stage"], e["type"]) for e in health["errors"]} == {
        ("reward", "ZeroDivisionError"),
        ("timeout", "Timed out: the reward did not finish within N s (wall clock)."),
        ("rollout", "Timed out: the rollout did not finish within N s (wall clock)."),
    }
    assert [t["step"] for t in health["slowest"]] == [2, 2, 2]
    assert run_reward_health(run=run, step_from=3)["trajectories"] == 3


def test_a_run_without_trajectories_has_empty_figures(alice):
    health = run_reward_health(run=RunFactory(owner=alice))
    assert health == {
        "step_from": None,
        "step_to": None,
        "trajectories": 0,
        "reward_timed": 0,
        "errors": [],
        "latency": {"p50_ms": None, "p95_ms": None, "max_ms": None},
        "per_step": [],
        "slowest": [],
    }


def test_it_costs_the_same_few_queries_however_many_steps(seeded, django_assert_num_queries):
    run, *_ = seeded
    _trajectories(TrajectoryGroupFactory(run=run, step=4), [(1, ZERO_DIV)] * 3)
    # errors, per step, overall, the error examples, the slowest.
    with django_assert_num_queries(5):
        run_reward_health(run=run)


def test_the_api_answers_the_selectors_figures_to_the_owner_only(seeded, alice, bob):
    run, *_ = seeded
    url = reverse("api-run-reward-health", args=[run.id])
    response = token_client(alice).get(url, {"step_from": 1, "step_to": 2})
    assert response.status_code == 200
    body = response.json()
    expected = run_reward_health(run=run, step_from=1, step_to=2)
    assert body == expected
    assert body["errors"][0]["type"] == "ZeroDivisionError" and body["errors"][0]["count"] == 2

    other = token_client(bob).get(url)
    assert other.status_code == 404 and "ZeroDivisionError" not in other.content.decode()


def test_the_api_says_which_step_bound_is_wrong(seeded, alice):
    run, *_ = seeded
    url = reverse("api-run-reward-health", args=[run.id])
    api = token_client(alice)
    response = api.get(url, {"step_from": 3, "step_to": 1})
    assert response.status_code == 400
    assert response.json()["field_errors"] == {"step_to": ["must be at least step_from"]}
    response = api.get(url, {"step_from": "two"})
    assert response.status_code == 400 and "step_from" in response.json()["field_errors"]


def test_the_page_is_the_owners_only(seeded, client, alice, bob):
    run, *_ = seeded
    url = reverse("run-reward-health", args=[run.id])
    client.force_login(alice)
    response = client.get(url)
    assert response.status_code == 200
    body = response.content.decode()
    assert 'id="health-data"' in body and "frontend/health.js" in body and "ZeroDivisionError" in body
    client.force_login(bob)
    assert client.get(url).status_code == 404


def _guest_error(value=None, raised=None):
    """The error the sandbox records when a reward returns `value` or raises `raised`: worded by the guest's
    own check (artweb_sdk.trajectory.check_reward) and prefix (_artweb_runner.results.stage_error)."""
    guest = Path(__file__).resolve().parents[2] / "rollouts" / "sandbox" / "guest"
    if str(guest) not in sys.path:
        sys.path.insert(0, str(guest))
    from _artweb_runner.results import stage_error
    from artweb_sdk.trajectory import check_reward

    try:
        if raised is not None:
            raise raised
        check_reward(value)
    except Exception as exc:
        return stage_error("reward", exc, {"reward.py"})
    raise AssertionError(f"{value!r} is a valid reward")


def test_it_files_nan_infinite_and_non_numeric_rewards_apart_from_raised_errors(alice):
    run = RunFactory(owner=alice, status="running")
    errors = [
        _guest_error(float("nan")),
        _guest_error(float("nan")),
        _guest_error(float("inf")),
        _guest_error(float("-inf")),
        _guest_error("0.5"),
        _guest_error(raised=ValueError("no answer tag")),
    ]
    _trajectories(TrajectoryGroupFactory(run=run, step=1), [(5, error) for error in errors])
    rows = [(e["stage"], e["type"], e["count"]) for e in run_reward_health(run=run)["errors"]]
    assert rows == [
        ("reward", "reward was NaN", 2),
        ("reward", "reward was infinite", 2),
        ("reward", "ValueError", 1),
        ("reward", "reward was not a number", 1),
    ]
