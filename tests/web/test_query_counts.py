"""A list page costs the same number of queries however many rows it lists: no query per row (N+1).

Each test seeds N rows, loads the page, seeds 2N more, loads it again, and expects the same count
under one budget, and every seeded row on the page (a page that lists nothing would pass trivially).
"""

from __future__ import annotations

import itertools

import pytest
from django.urls import reverse

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
    StepFactory,
    TrajectoryFactory,
    TrajectoryGroupFactory,
)
from training.models import ExportTarget, JudgeEndpoint, RunEvent, RunLog

N = 3
_names = itertools.count()


def name(prefix: str) -> str:
    return f"{prefix}-{next(_names):03d}"


@pytest.fixture
def flat(as_user, django_assert_max_num_queries):
    """flat(user, url, seed, budget): seed(n) adds n rows and returns texts the page must show."""

    def check(user, url: str, seed, budget: int):
        client = as_user(user)
        shown = seed(N)
        client.get(url)  # first request: session and per-process lookups that later requests skip
        with django_assert_max_num_queries(budget) as few:
            response = client.get(url)
        assert response.status_code == 200
        shown += seed(2 * N)
        with django_assert_max_num_queries(budget) as many:
            response = client.get(url)
        assert response.status_code == 200
        page = response.content.decode()
        assert [text for text in shown if text not in page] == []
        assert len(many) == len(few), "\n".join(q["sql"] for q in many.captured_queries)

    return check


def test_the_runs_list(alice, flat):
    BaseModelFactory()

    def seed(n):
        runs = [
            RunFactory(owner=alice, name=name("run"), tags=["nightly"], steps_done=1, latest_reward=0.5)
            for _ in range(n)
        ]
        return [r.name for r in runs] + [r.script_version.asset.name for r in runs]

    # 2 of them: the quota panel (its limits, its usage); 5: the waiting runs' places in the fair queue
    # (training.selectors_queue.run_queue_places: the same 5 whatever the number of runs).
    flat(alice, reverse("run-list"), seed, budget=13)


def test_the_scripts_list(alice, flat):
    def seed(n):
        scripts = [RolloutScriptFactory(owner=alice, name=name("script")) for _ in range(n)]
        for script in scripts:
            for number in (1, 2):
                RolloutScriptVersionFactory(asset=script, number=number, content=f"# v{number}\n{SCRIPT}")
        return [s.name for s in scripts]

    flat(alice, reverse("script-list"), seed, budget=4)


def test_the_rewards_list(alice, flat):
    def seed(n):
        rewards = [RewardFunctionFactory(owner=alice, name=name("reward")) for _ in range(n)]
        for reward in rewards:
            for number in (1, 2):
                RewardFunctionVersionFactory(asset=reward, number=number, content=f"# v{number}\n{REWARD}")
        return [r.name for r in rewards]

    flat(alice, reverse("reward-list"), seed, budget=4)


def test_the_scenario_sets_list(alice, flat):
    def seed(n):
        return [ScenarioSetFactory(owner=alice, name=name("scenarios")).name for _ in range(n)]

    flat(alice, reverse("scenario-set-list"), seed, budget=3)


def test_the_models_page(alice, flat):
    def seed(n):
        models = [BaseModelFactory(name=name("model"), owner=alice) for _ in range(n)]
        judges = [
            JudgeEndpoint.objects.create(
                owner=alice,
                name=name("judge"),
                base_url="https://judge.example/v1",
                model="judge-model",
                key_encrypted="x",
                key_last4="wxyz",
            )
            for _ in range(n)
        ]
        return [m.name for m in models] + [j.name for j in judges]

    flat(alice, reverse("model-list"), seed, budget=4)


def test_the_exports_page(alice, flat):
    ExportTarget.objects.create(owner=alice, kind="wandb", settings={"project": "every-run"})

    def seed(n):
        targets = [
            ExportTarget.objects.create(
                owner=alice,
                run=RunFactory(owner=alice),
                kind="wandb",
                settings={"project": name("project")},
                secret_encrypted="x",
                secret_last4="abcd",
            )
            for _ in range(n)
        ]
        return [f"#{t.run_id} {t.run.name}" for t in targets]

    flat(alice, reverse("export-list"), seed, budget=3)


@pytest.mark.parametrize("view", ["?step=1", "?all_steps=on", "?step=1&traj={first}"])
def test_the_trajectory_inspector(alice, flat, view):
    run = RunFactory(owner=alice)
    scenarios = list(run.scenario_set.scenarios.all())
    first = TrajectoryFactory(group=TrajectoryGroupFactory(run=run, step=1, scenario=scenarios[0]), index=0)

    def seed(n):
        shown = []
        for i in range(n):
            group = TrajectoryGroupFactory(run=run, step=1, scenario=scenarios[i % len(scenarios)])
            for index in range(2):
                traj = TrajectoryFactory(group=group, index=index, reward=0.25 + index)
                shown.append(f"traj={traj.id}")
        return shown

    url = reverse("run-trajectories", args=[run.id]) + view.format(first=first.id)
    flat(alice, url, seed, budget=7 if "traj" in view else 6)


def test_the_run_page(alice, flat):
    run = RunFactory(owner=alice, num_steps=100)
    scenario = run.scenario_set.scenarios.first()
    steps = itertools.count(1)

    def seed(n):
        shown = []
        for _ in range(n):
            step = next(steps)
            StepFactory(run=run, step=step, reward_mean=0.1)
            shown.append(f"/runs/{run.id}/checkpoints/{CheckpointFactory(run=run, step=step).id}/download/")
            shown.append(RunEvent.objects.create(run=run, kind="note", message=name("event")).message)
            RunEvent.objects.create(run=run, kind="alert", message=name("warning"), data={"level": "warning"})
            shown.append(RunLog.objects.create(run=run, step=step, message=name("log")).message)
            group = TrajectoryGroupFactory(run=run, step=step, scenario=scenario)
            for index in range(2):
                TrajectoryFactory(
                    group=group,
                    index=index,
                    reward=float(index),
                    messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": name("answer")}],
                )
        return shown

    # 5 of them: its place in the fair queue (a queued run waits for a GPU worker).
    flat(alice, reverse("run-detail", args=[run.id]), seed, budget=20)
