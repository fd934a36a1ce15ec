"""A list endpoint costs the same number of queries however many rows it returns: no query per row (N+1).

Each test seeds N rows, asks for the list, seeds 2N more, asks again, and expects the same count under
one budget, and every seeded row in the answer (an empty answer would pass trivially).
"""

from __future__ import annotations

import itertools

import pytest

from artweb.testing.factories import (
    REWARD,
    SCRIPT,
    BaseModelFactory,
    CheckpointFactory,
    RewardFunctionFactory,
    RewardFunctionVersionFactory,
    RolloutScriptFactory,
    RolloutScriptVersionFactory,
    RunFactory,
    ScenarioSetFactory,
    TrajectoryFactory,
    TrajectoryGroupFactory,
)
from training.models import ExportTarget, JudgeEndpoint, RunEvent, RunLog

N = 3
_numbers = itertools.count()


@pytest.fixture
def flat(alice_api, django_assert_max_num_queries):
    """flat(url, seed, budget): seed(n) adds n rows and returns their ids, which the answer must list."""

    def check(url: str, seed, budget: int):
        listed = seed(N)
        alice_api.get(url)  # first request: per-process lookups that later requests skip
        with django_assert_max_num_queries(budget) as few:
            response = alice_api.get(url)
        assert response.status_code == 200, response.content
        listed += seed(2 * N)
        with django_assert_max_num_queries(budget) as many:
            response = alice_api.get(url)
        assert response.status_code == 200, response.content
        body = response.json()
        rows = body["results"] if isinstance(body, dict) else body  # a few short lists are not paged
        assert sorted(row["id"] for row in rows) == sorted(listed)
        assert len(many) == len(few), "\n".join(q["sql"] for q in many.captured_queries)

    return check


@pytest.fixture
def run(alice):
    return RunFactory(owner=alice)


def test_runs(alice, flat):
    def seed(n):
        return [RunFactory(owner=alice, tags=["nightly"]).id for _ in range(n)]

    flat("/api/v1/runs/", seed, budget=3)


def test_scripts(alice, flat):
    def seed(n):
        scripts = [
            RolloutScriptFactory(owner=alice, companion_reward=RewardFunctionFactory(owner=alice)) for _ in range(n)
        ]
        for script in scripts:
            for number in (1, 2):
                RolloutScriptVersionFactory(asset=script, number=number, content=f"# v{number}\n{SCRIPT}")
        return [s.id for s in scripts]

    flat("/api/v1/scripts/", seed, budget=3)


def test_rewards(alice, flat):
    def seed(n):
        rewards = [RewardFunctionFactory(owner=alice) for _ in range(n)]
        for reward in rewards:
            for number in (1, 2):
                RewardFunctionVersionFactory(asset=reward, number=number, content=f"# v{number}\n{REWARD}")
        return [r.id for r in rewards]

    flat("/api/v1/rewards/", seed, budget=3)


def test_script_versions(alice, flat):
    script = RolloutScriptFactory(owner=alice)
    numbers = itertools.count(1)

    def seed(n):
        return [
            RolloutScriptVersionFactory(asset=script, number=(k := next(numbers)), content=f"# v{k}\n{SCRIPT}").id
            for _ in range(n)
        ]

    flat(f"/api/v1/scripts/{script.id}/versions/", seed, budget=4)


def test_scenario_sets(alice, flat):
    def seed(n):
        return [ScenarioSetFactory(owner=alice).id for _ in range(n)]

    flat("/api/v1/scenario-sets/", seed, budget=3)


def test_base_models(alice, flat):
    def seed(n):
        return [BaseModelFactory(name=f"model-{next(_numbers)}", owner=alice).id for _ in range(n)]

    flat("/api/v1/base-models/", seed, budget=3)


def test_judges(alice, flat):
    def seed(n):
        return [
            JudgeEndpoint.objects.create(
                owner=alice,
                name=f"judge-{next(_numbers)}",
                model="m",
                base_url="https://judge.example/v1",
                key_encrypted="x",
                key_last4="wxyz",
            ).id
            for _ in range(n)
        ]

    flat("/api/v1/judges/", seed, budget=2)


def test_export_targets(alice, flat):
    def seed(n):
        return [
            ExportTarget.objects.create(
                owner=alice,
                run=RunFactory(owner=alice),
                kind="wandb",
                settings={"project": "p"},
                secret_encrypted="x",
                secret_last4="abcd",
            ).id
            for _ in range(n)
        ]

    flat("/api/v1/export-targets/", seed, budget=2)


def test_trajectories(run, flat):
    def seed(n):
        group = TrajectoryGroupFactory(run=run, step=1)
        return [TrajectoryFactory(group=group, index=i).id for i in range(n)]

    flat(f"/api/v1/runs/{run.id}/trajectories/", seed, budget=3)


def test_groups(run, flat):
    scenarios = list(run.scenario_set.scenarios.all())

    def seed(n):
        return [
            TrajectoryGroupFactory(run=run, step=1, scenario=scenarios[next(_numbers) % len(scenarios)]).id
            for _ in range(n)
        ]

    flat(f"/api/v1/runs/{run.id}/groups/", seed, budget=3)


def test_checkpoints(run, flat):
    def seed(n):
        return [CheckpointFactory(run=run).id for _ in range(n)]

    flat(f"/api/v1/runs/{run.id}/checkpoints/", seed, budget=3)


def test_events(alice, run, flat):
    def seed(n):
        return [RunEvent.objects.create(run=run, kind="note", message="m", actor=alice).id for _ in range(n)]

    flat(f"/api/v1/runs/{run.id}/events/", seed, budget=3)


def test_logs(run, flat):
    def seed(n):
        return [RunLog.objects.create(run=run, step=1, message="line").id for _ in range(n)]

    flat(f"/api/v1/runs/{run.id}/logs/", seed, budget=3)
