"""Weave: the environment a run's rollout sandboxes get, and a script with @weave.op in the sandbox."""

import os
import subprocess
import sys
import textwrap

import pytest

from artweb.testing.factories import RunFactory
from rollouts.sandbox.batch import SandboxLimits
from rollouts.sandbox.rollouts import RolloutRequest, run_rollouts
from tests.egress import egress_allow
from training.exports.services import export_target_create, export_target_update
from training.exports.weave import export_rollout_env


def test_no_weave_target_means_no_environment(alice):
    assert export_rollout_env(run=RunFactory(owner=alice)) == {}


def test_a_weave_target_hands_the_sandbox_its_project_and_key(alice, monkeypatch, settings):
    egress_allow(settings, "http://wandb.internal:8080")  # a self-hosted server, as an operator would allow it
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    monkeypatch.delenv("WF_TRACE_SERVER_URL", raising=False)
    run = RunFactory(owner=alice)
    target = export_target_create(
        owner=alice, kind="weave", settings={"project": "team/agents"}, secret="wandb-key-0123456789"
    )
    assert export_rollout_env(run=run) == {"WEAVE_PROJECT": "team/agents", "WANDB_API_KEY": "wandb-key-0123456789"}
    export_target_update(
        target=target, actor=alice, settings={"project": "team/agents", "base_url": "http://wandb.internal:8080"}
    )
    assert export_rollout_env(run=run)["WANDB_BASE_URL"] == "http://wandb.internal:8080"
    export_target_update(target=target, actor=alice, enabled=False)
    assert export_rollout_env(run=run) == {}


def test_without_any_key_rollouts_run_untraced(staff, monkeypatch):
    """The operator's own (staff) target may take the worker's key; nobody else's may (test_worker_env.py)."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    run = RunFactory(owner=staff)
    export_target_create(owner=staff, kind="weave", settings={"project": "team/agents"})
    assert export_rollout_env(run=run) == {}
    monkeypatch.setenv("WANDB_API_KEY", "from-env-key")
    assert export_rollout_env(run=run)["WANDB_API_KEY"] == "from-env-key"


def test_an_unreadable_key_never_raises_into_the_step(alice, settings):
    run = RunFactory(owner=alice)
    export_target_create(owner=alice, kind="weave", settings={"project": "team/agents"}, secret="k" * 20)
    settings.SECRET_KEY = "rotated-without-fallback-" * 3
    assert export_rollout_env(run=run) == {}


WEAVE_SCRIPT = textwrap.dedent("""
    import weave

    @weave.op
    def score(text: str) -> float:
        return float(len(text))

    print(score("four"))
""")


def test_real_weave_with_tracing_disabled_runs_a_weave_op_script_offline(tmp_path):
    """What the sandbox does for a run without Weave: WEAVE_DISABLED=true, so even a script that calls
    weave.init itself neither prompts for a key nor touches the network."""
    script = tmp_path / "s.py"
    script.write_text("import weave\nweave.init('someone/project')\n" + WEAVE_SCRIPT)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "WEAVE_DISABLED": "true"}
    out = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("4.0")


SANDBOX_SCRIPT = textwrap.dedent("""
    import art
    import weave


    @weave.op
    def score(text: str) -> float:
        return float(len(text))


    async def rollout(model: art.Model, scenario) -> art.Trajectory:
        messages = [{"role": "user", "content": scenario["prompt"]},
                    {"role": "assistant", "content": "ok"}]
        return art.Trajectory(messages_and_choices=messages, reward=score(scenario["prompt"]))
""")
# ART scripts often call weave.init themselves; that too must work with and without Weave configured.
SANDBOX_SCRIPT_WITH_INIT = "import weave\nweave.init('team/agents')\n" + SANDBOX_SCRIPT


@pytest.mark.slow
@pytest.mark.parametrize("script", [SANDBOX_SCRIPT, SANDBOX_SCRIPT_WITH_INIT], ids=["op-only", "op-and-init"])
@pytest.mark.parametrize("weave_env", [{}, "configured"], ids=["without-weave", "with-weave"])
def test_a_weave_op_script_runs_in_the_sandbox_with_and_without_weave(weave_env, script, recording_server):
    """With Weave configured, the sandbox initialises the real weave against the run's W&B server; a real
    W&B/Weave server cannot run here, so a local endpoint stands in. It answers nothing weave expects,
    so this checks the contract that matters most: a misbehaving Weave never fails a rollout."""
    env = (
        {}
        if not weave_env
        else {
            "WEAVE_PROJECT": "team/agents",
            "WANDB_API_KEY": "k" * 40,
            "WANDB_BASE_URL": recording_server.url,
            "WF_TRACE_SERVER_URL": recording_server.url + "/traces",
        }
    )
    request = RolloutRequest(
        script=script,
        reward=None,
        scenarios=[{"prompt": "four"}],
        group_size=2,
        base_url="http://127.0.0.1:9/v1",
        model_name="unused",
        sampling={},
        concurrency=2,
        max_exceptions=0.0,
        limits=SandboxLimits(rollout_timeout_s=60),
        env=env,
    )
    (result,) = run_rollouts(request)
    assert [t["error"] or "" for t in result.trajectories] == ["", ""]
    assert [t["reward"] for t in result.trajectories] == [4.0, 4.0]
