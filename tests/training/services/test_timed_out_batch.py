"""A step, and a dry run, whose sandbox batch reaches its deadline: what finished is kept for the trajectory
inspector (or the dry run's page) with its logs, and the failure says which rollouts were still running.

Both run in this process as the worker runs them, with the real jailed sandbox and the database, and the
inference server and trainer of tests/training/services/test_failed_steps.py (an address the scripts
never dial, and a marker where training would start). The batch's limit, which a step derives from the
run's rollout_timeout_s (a minute or more), is set to a few seconds: the one setting changed.
"""

import functools
import time

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from artweb.testing.factories import BaseModelFactory, RolloutScriptVersionFactory, RunFactory
from rollouts.sandbox import rollouts as sandbox_rollouts
from rollouts.sandbox.batch import SandboxLimits
from rollouts.sandbox.records import deadline_stopped
from tests.training.services.test_failed_steps import execute, worker  # noqa: F401 (the worker fixture)
from training import services
from training.config import run_config_parse
from training.models import DryRun, Run, TrajectoryGroup
from training.services import dry_runs
from training.services.steps import batch as step_batch

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LIMIT_S = 5

# The first rollout prints, lets the others finish, then holds its sandbox process in C code where no
# timeout reaches it; every other rollout finishes.
FIRST_HANGS = """
import art, asyncio, ctypes, itertools

counter = itertools.count()

async def rollout(model, scenario):
    n = next(counter)
    print(f"rollout {n} starting")
    if n == 0:
        print("waiting on the tool")
        await asyncio.sleep(0.3)
        while True:
            ctypes.PyDLL(None).sleep(60)
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": "x"},
                                                {"role": "assistant", "content": f"answer {n}"}], reward=n / 10)
"""


def test_a_step_past_its_deadline_keeps_what_finished_and_names_what_was_running(alice, monkeypatch):
    monkeypatch.setattr(step_batch, "SandboxLimits", functools.partial(SandboxLimits, batch_timeout_s=LIMIT_S))
    config = run_config_parse({"max_exceptions": 0.0, "group_size": 2, "scenarios_per_step": 2, "concurrency": 4})
    run = RunFactory(
        owner=alice,
        status=Run.Status.QUEUED,
        config=config.model_dump(),
        reward_version=None,
        script_version=RolloutScriptVersionFactory(asset__owner=alice, content=FIRST_HANGS),
    )
    pumped = []
    pump = sandbox_rollouts.pump
    monkeypatch.setattr(sandbox_rollouts, "pump", lambda *a, **k: pumped.append(time.monotonic()) or pump(*a, **k))
    run = execute(run)
    freed_after_s = time.monotonic() - (pumped[0] + LIMIT_S)  # the batch's loop started LIMIT_S before its deadline
    print(f"deadline to worker free (the step failed, its groups kept): {freed_after_s * 1000:.0f} ms")
    assert freed_after_s < 5.0  # the sandbox goes at once (tests/rollouts/sandbox); the rest is the step's own

    assert run.status == Run.Status.FAILED
    assert run.error.startswith("StepFailed: 2 of 4 rollouts failed, more than max_exceptions=0 allows")
    groups = list(TrajectoryGroup.objects.filter(run=run, step=1).order_by("id"))
    number = groups[0].scenario.index  # the scenario's number, as the inspector shows it
    assert (
        "First error:\nThe batch did not finish within its 5 s limit, so it was stopped with 2 rollouts "
        f"unfinished: scenario {number} sample 0, scenario {number} sample 1." in run.error
    )
    assert len(groups) == 2 and all(g.failed_attempt for g in groups)
    hung, finished = (list(g.trajectories.order_by("index")) for g in groups)
    assert all(deadline_stopped(t.error) for t in hung)
    assert [t.error for t in finished] == ["", ""]
    assert [t.reward for t in finished] == [0.2, 0.3]
    assert [t.logs for t in finished] == [["rollout 2 starting"], ["rollout 3 starting"]]

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=alice).key}")
    listed = api.get(f"/api/v1/runs/{run.id}/trajectories/?step=1").json()["results"]
    assert len(listed) == 4 and all(t["failed_attempt"] for t in listed)
    assert sum(1 for t in listed if deadline_stopped(t["error"])) == 2


def test_a_dry_run_past_its_deadline_says_which_rollout_hung_and_keeps_the_others(alice, monkeypatch):
    monkeypatch.setattr(dry_runs, "DRY_RUN_WAVE_S", float(LIMIT_S))
    dry = DryRun.objects.create(
        owner=alice,
        script_version=RolloutScriptVersionFactory(asset__owner=alice, content=FIRST_HANGS),
        base_model=BaseModelFactory(),
        scenarios=[{"i": 0}, {"i": 1}],
        samples=1,
    )
    services.dry_runs.dry_run_execute(dry_run_id=dry.id)

    dry.refresh_from_db()
    assert dry.status == "done", dry.error
    hung, finished = dry.result["trajectories"]
    assert deadline_stopped(hung["error"]) and "This one (scenario 0) had sent no result" in hung["error"]
    assert finished["error"] is None and finished["logs"] == ["rollout 1 starting"]
    assert dry.result["spread"]["message"].startswith(
        "The batch did not finish within its 5 s limit, so it was stopped with 1 rollout unfinished: scenario 0. "
        "Each one's error below says where it was and what it printed last. "
    )
