"""A run scored by RULER: the step's batch is judged by the run's base model, through the proxy.

The judge is a server with known answers (tests.rollouts.sandbox.fake_judge) standing in for the base
model on the worker's inference server: no model could be relied on to give known scores. The scripts
never call the policy. Everything else is real: the jailed sandbox, the proxy, the database.
"""

from types import SimpleNamespace

import pytest

from artweb.errors import ApplicationError
from artweb.testing.factories import RewardFunctionVersionFactory, RolloutScriptVersionFactory, RunFactory
from tests.rollouts.sandbox.fake_judge import FakeJudge
from training.config import RunConfig, run_config_parse
from training.engine.advantages import compute_advantages
from training.models import Trajectory
from training.services import inference
from training.services.steps import batch
from training.services.steps.groups import groups_persist

# Sets no reward: under RULER the judge's score is the only one. Answers differ (identical ones would be
# judged once, as one).
SCRIPT = """
import art, itertools

counter = itertools.count()

async def rollout(model, scenario):
    return art.Trajectory(messages_and_choices=[
        {"role": "user", "content": scenario.prompt}, {"role": "assistant", "content": f"answer {next(counter)}"}])
"""

SCORES = [0.2, 0.9, 0.5]
NEVER_STOP = SimpleNamespace(should_stop=lambda: False)
NO_SERVER = "http://127.0.0.1:9/v1"


def make_run(alice, *, reward: str | None = None, use_ruler: bool = True, script: str = SCRIPT):
    script_version = RolloutScriptVersionFactory(asset__owner=alice, content=script)
    reward_version = RewardFunctionVersionFactory(asset__owner=alice, content=reward) if reward else None
    return RunFactory(
        owner=alice,
        script_version=script_version,
        reward_version=reward_version,
        config=run_config_parse({"use_ruler": use_ruler, "group_size": 3}).model_dump(),
    )


def server_for(judge, *, merged=False):
    """The worker's inference server as the step sees it; its base model is the fake judge."""
    return SimpleNamespace(
        base_url=judge.base_url, api_key="worker-key", base_model_name="SmolLM2-135M-Instruct", merged=merged
    )


def rollouts(run, server, policy, timings=None):
    cfg = RunConfig.model_validate(run.config)
    scenarios = list(run.scenario_set.scenarios.filter(split="train").order_by("index")[:2])
    return scenarios, batch.rollouts_run(
        run, cfg, scenarios, policy, server, NEVER_STOP, cfg.group_size, timings=timings
    )


def test_a_ruler_run_without_a_reward_function_is_rewarded_by_the_judge(alice):
    run = make_run(alice)
    timings = {}
    with FakeJudge(SCORES) as judge:
        scenarios, results = rollouts(run, server_for(judge), "SmolLM2-135M-Instruct", timings)
    for group in results:
        assert group.errors == [] and group.rewards == SCORES
    # The base model was asked, with the worker's key, once per group.
    assert [(r["body"]["model"], r["authorization"]) for r in judge.requests] == [
        ("SmolLM2-135M-Instruct", "Bearer worker-key")
    ] * 2
    assert timings["ruler"] > 0 and "judge_server" in timings

    # GRPO's advantages follow the judge: (score - mean) / (population std + 1e-6), by hand.
    advantages = compute_advantages([g.trajectories for g in results])
    assert advantages.used == [True, True]
    for values in advantages.values:
        assert values == pytest.approx([-1.16248, 1.27872, -0.11625], abs=1e-4)

    type(run).objects.filter(id=run.id).update(worker="worker-1")
    groups = groups_persist(run, 1, "train", scenarios, results, me="worker-1")
    rows = list(Trajectory.objects.filter(group=groups[0]).order_by("index"))
    assert [t.reward for t in rows] == SCORES
    assert [t.metadata["ruler_explanation"] for t in rows] == [f"judged {k} of 3" for k in (1, 2, 3)]
    assert groups[0].reward_mean == pytest.approx(sum(SCORES) / 3) and not groups[0].skipped


def test_with_a_reward_function_its_value_is_kept_as_the_independent_reward(alice):
    run = make_run(alice, reward="def reward(trajectory, scenario):\n    return 0.75\n")
    with FakeJudge(SCORES) as judge:
        _, results = rollouts(run, server_for(judge), "SmolLM2-135M-Instruct")
    for group in results:
        assert group.rewards == SCORES
        assert [t["metrics"]["independent_reward"] for t in group.trajectories] == [0.75] * 3
        assert [t["metrics"]["ruler_score"] for t in group.trajectories] == SCORES


def test_in_merged_mode_a_steps_policy_is_judged_by_a_second_server_of_the_base_model(alice, monkeypatch):
    run = make_run(alice)
    started = []
    with FakeJudge(SCORES) as judge:

        def judge_server(base_model):
            started.append(base_model)
            return SimpleNamespace(
                base_url=judge.base_url, api_key="judge-server-key", base_model_name="SmolLM2-135M-Instruct"
            )

        monkeypatch.setattr(inference, "judge_server", judge_server)
        # The policy server holds run-N@1's merged weights: it cannot answer to the base model's name.
        policy_server = SimpleNamespace(
            base_url=NO_SERVER, api_key="worker-key", base_model_name="SmolLM2-135M-Instruct", merged=True
        )
        _, results = rollouts(run, policy_server, f"run-{run.id}@1")
    assert started == [run.base_model]
    assert [g.rewards for g in results] == [SCORES, SCORES]
    assert {r["authorization"] for r in judge.requests} == {"Bearer judge-server-key"}


def test_in_merged_mode_at_step_zero_the_policy_server_judges(alice, monkeypatch):
    run = make_run(alice)
    monkeypatch.setattr(inference, "judge_server", lambda base_model: pytest.fail("no second server is needed"))
    with FakeJudge(SCORES) as judge:
        _, results = rollouts(run, server_for(judge, merged=True), "SmolLM2-135M-Instruct")
    assert [g.rewards for g in results] == [SCORES, SCORES]


def test_a_run_whose_reward_function_calls_art_rewards_gets_the_judge_without_use_ruler(alice):
    reward = (
        "import art\n\nasync def score_group(group, scenario):\n"
        "    return [t.reward for t in await art.rewards.ruler_score_group(group)]\n"
    )
    run = make_run(alice, reward=reward, use_ruler=False)
    with FakeJudge(SCORES) as judge:
        _, results = rollouts(run, server_for(judge), "SmolLM2-135M-Instruct")
    assert [g.rewards for g in results] == [SCORES, SCORES]


def test_a_run_without_ruler_admits_no_judge(alice, monkeypatch):
    run = make_run(alice, script=SCRIPT.replace('}"}])', '}"}], reward=1.0)'), use_ruler=False)
    monkeypatch.setattr(inference, "judge_endpoint", lambda *a, **k: pytest.fail("no judge is needed"))
    _, results = rollouts(run, SimpleNamespace(base_url=NO_SERVER, api_key="k"), "run-1@0")
    assert [g.rewards for g in results] == [[1.0] * 3] * 2


def test_the_config_takes_the_three_kinds_of_judge_and_refuses_anything_else():
    assert run_config_parse({"use_ruler": True}).ruler_judge == ""
    assert run_config_parse({"ruler_judge": " model:Qwen "}).ruler_judge == "model:Qwen"
    assert run_config_parse({"ruler_judge": "endpoint:ext"}).ruler_judge == "endpoint:ext"
    with pytest.raises(ApplicationError, match="is not a judge: leave it empty"):
        run_config_parse({"ruler_judge": "gpt-4o"})
