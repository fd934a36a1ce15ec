"""The step loop's use of the sandbox settings: jailed by default, and the development opt-out marked on
every run that uses it. The scripts never call the model, so no inference server is needed; the server
argument only carries an address and a key."""

import os
from types import SimpleNamespace

import pytest

from artweb.testing.factories import RolloutScriptVersionFactory, RunFactory
from training.config import RunConfig
from training.models import RunEvent
from training.services import steps
from training.services.steps import batch

SCRIPT = """
import art, os

async def rollout(model, scenario):
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=1.0,
                          metadata={"uid": os.getuid()})
"""

SERVER = SimpleNamespace(base_url="http://127.0.0.1:9/v1", api_key="not-used")
NEVER_STOP = SimpleNamespace(should_stop=lambda: False)


@pytest.fixture
def run(alice):
    script = RolloutScriptVersionFactory(asset__owner=alice, content=SCRIPT)
    return RunFactory(owner=alice, script_version=script, reward_version=None)


def rollouts(run):
    cfg = RunConfig.model_validate(run.config)
    scenarios = list(run.scenario_set.scenarios.filter(split="train")[:2])
    return batch.rollouts_run(run, cfg, scenarios, "run-1@0", SERVER, NEVER_STOP, 2)


def unjailed_events(run):
    return list(RunEvent.objects.filter(run=run, kind=steps.UNJAILED_EVENT).values_list("message", flat=True))


def test_it_runs_user_code_jailed_by_default(run):
    results = rollouts(run)
    assert [t["metadata"]["uid"] for g in results for t in g.trajectories] == [1000] * 4
    assert unjailed_events(run) == []


def test_it_marks_a_run_that_uses_the_opt_out_once(run, settings):
    settings.ARTWEB = {**settings.ARTWEB, "SANDBOX": "insecure-no-jail"}
    for _ in range(2):
        results = rollouts(run)
    # Unjailed, the code runs as the worker itself: exactly what the warning is about.
    assert [t["metadata"]["uid"] for g in results for t in g.trajectories] == [os.getuid()] * 4
    [message] = unjailed_events(run)
    assert "WITHOUT the sandbox jail" in message and "insecure-no-jail" in message


def test_it_refuses_an_unknown_sandbox_mode(run, settings):
    from rollouts.sandbox.jail import JailUnavailable

    settings.ARTWEB = {**settings.ARTWEB, "SANDBOX": "off"}
    with pytest.raises(JailUnavailable, match="'jail' or 'insecure-no-jail'"):
        rollouts(run)
