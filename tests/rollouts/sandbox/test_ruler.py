"""RULER: the judge's prompt and parser, artweb's scoring of a batch's groups in the sandbox, and
`art.rewards` as ART scripts call it.

The sandbox tests run jailed, against a judge server with known answers (tests.rollouts.sandbox.fake_judge)
reached through the inference proxy; the scripts never call the policy. The last test asks the session's
real vLLM server to judge.
"""

import asyncio
import json
import sys
from pathlib import Path

import pytest

from rollouts.sandbox.proxy import Upstream
from rollouts.sandbox.rollouts import run_rollouts
from rollouts.sandbox.ruler import Judge, ruler_score_group

from .fake_judge import FakeJudge

GUEST = Path(__file__).resolve().parents[3] / "rollouts" / "sandbox" / "guest"
if str(GUEST) not in sys.path:
    sys.path.insert(0, str(GUEST))

from artweb_sdk import ruler as sdk  # noqa: E402 - importable once the guest directory is on sys.path

JUDGE_KEY = "judge-secret"

# No reward anywhere: under RULER the judge's score is the only one.
NO_REWARD = """
import art, itertools

counter = itertools.count()

async def rollout(model, scenario):
    n = next(counter)
    return art.Trajectory(messages_and_choices=[
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": f"Scenario {scenario.i}"},
        {"role": "assistant", "content": f"answer {n}"}])
"""

WITH_REWARD = NO_REWARD.replace('f"answer {n}"}])', 'f"answer {n}"}], reward=0.25 + scenario.i)')


def judged_request(request_for, script, judge, **kwargs):
    kwargs.setdefault("scenarios", [{"i": 0}, {"i": 1}])
    return request_for(
        script,
        model_name="run-7@3",
        judge_model="judge-model",
        extra_models={"judge-model": Upstream(judge.base_url, JUDGE_KEY)},
        **kwargs,
    )


# --- the prompt and the parser -------------------------------------------------------------------


def test_it_reads_scores_around_fences_and_garbled_ids():
    text = (
        'Here you go:\n```json\n{"scores": [{"trajectory_id": "2", "explanation": "b", "score": 0.2},'
        ' {"trajectory_id": "one", "explanation": "a", "score": 1.7}]}\n```'
    )
    first, second = sdk.parse_scores(text, 2)
    assert (first.score, first.explanation) == (1.0, "a")  # clamped to [0, 1], placed by position
    assert (second.score, second.explanation) == (0.2, "b")
    for bad, why in (
        ("no json", "no JSON object"),
        ('{"scores": [{"score": 1}]}', "1 scores for 2"),
        ('{"scores": [{"score": "high"}, {"score": 1}]}', "no numeric score"),
    ):
        with pytest.raises(ValueError, match=why):
            sdk.parse_scores(bad, 2)


def test_it_shows_the_messages_every_trajectory_shares_once():
    shared = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}]
    lists = [[*shared, {"role": "assistant", "content": "4"}], [*shared, {"role": "assistant", "content": "5"}]]
    _, user = sdk.judge_messages(lists, scenario={"question": "2 + 2"})
    text = user["content"]
    assert text.count("Be brief.") == 1 and text.index("<context>") < text.index('<trajectory id="1">')
    assert "assistant: 4" in text and "assistant: 5" in text and '"question": "2 + 2"' in text


def test_it_asks_in_words_when_the_judge_refuses_a_schema_and_judges_identical_trajectories_once():
    same = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    with FakeJudge([0.7], refuse_schema=True) as judge:
        records = [{"messages": same, "reward": None, "metrics": {}, "metadata": {}, "error": None} for _ in range(3)]
        ruler_score_group(records, Judge(base_url=judge.base_url, model="judge-model", api_key=JUDGE_KEY))
    assert [r["reward"] for r in records] == [0.7, 0.7, 0.7]
    assert ["response_format" in r["body"] for r in judge.requests] == [True, False]
    assert judge.trajectory_counts() == [1, 1]
    assert judge.requests[0]["authorization"] == f"Bearer {JUDGE_KEY}"


# --- artweb scoring a batch's groups ---------------------------------------------------------------


def test_it_makes_the_judges_scores_the_rewards_of_a_batch_without_a_reward_function(request_for):
    with FakeJudge([0.2, 0.9, 0.5]) as judge:
        results = run_rollouts(judged_request(request_for, NO_REWARD, judge, group_size=3, ruler=True))
    for group in results:
        assert group.errors == []
        assert group.rewards == [0.2, 0.9, 0.5]
        for k, t in enumerate(group.trajectories):
            assert t["metrics"] == {"ruler_score": t["reward"]}  # there was no reward before the judge's
            assert t["metadata"]["ruler_explanation"] == f"judged {k + 1} of 3"
        assert group.judge_s > 0
    # One request per group, for the batch's judge, with the worker's key added by the proxy.
    assert [r["body"]["model"] for r in judge.requests] == ["judge-model"] * 2
    assert {r["authorization"] for r in judge.requests} == {f"Bearer {JUDGE_KEY}"}
    assert judge.trajectory_counts() == [3, 3]


def test_it_keeps_the_reward_functions_value_as_the_independent_reward(request_for):
    reward = "def reward(trajectory, scenario):\n    return 0.5 + scenario.i\n"
    with FakeJudge([1.0, 0.0]) as judge:
        results = run_rollouts(judged_request(request_for, NO_REWARD, judge, reward=reward, ruler=True))
    for i, group in enumerate(results):
        assert group.rewards == [1.0, 0.0]
        assert [t["metrics"]["independent_reward"] for t in group.trajectories] == [0.5 + i] * 2


def test_a_judge_without_a_usable_answer_fails_its_groups_rollouts(request_for):
    with FakeJudge([], reply="I think they are all fine.") as judge:
        results = run_rollouts(judged_request(request_for, WITH_REWARD, judge, ruler=True, scenarios=[{"i": 0}]))
    [group] = results
    assert group.rewards == [None, None]
    for error in group.errors:
        assert error.startswith("RULER did not score this group: The judge `judge-model` gave no usable scores")
    assert len(judge.requests) == 3  # max_attempts


def test_a_batch_without_ruler_still_needs_a_reward(request_for):
    with FakeJudge([1.0, 1.0]) as judge:
        results = run_rollouts(judged_request(request_for, NO_REWARD, judge, scenarios=[{"i": 0}]))
    assert results[0].errors == ["The rollout set no trajectory.reward and no reward function is attached."] * 2
    assert judge.requests == []


def test_it_refuses_a_judge_the_batch_may_not_call(request_for):
    with pytest.raises(ValueError, match="neither the batch's model"):
        run_rollouts(request_for(NO_REWARD, model_name="run-7@3", judge_model="elsewhere", ruler=True))


# --- art.rewards in a person's code ----------------------------------------------------------------

ART_SCORE_GROUP = """
import art

async def score_group(group, scenario):
    judged = await art.rewards.ruler_score_group(group{args})
    assert [t.metrics["independent_reward"] for t in judged] == [0.25 + scenario.i] * len(group)
    assert [t.reward for t in group] == [0.25 + scenario.i] * len(group)  # ART scores copies
    assert judged[0].logs[-1] == "RULER explanation: judged 1 of 2", judged[0].logs
    return [t.reward for t in judged]
"""


def test_art_scripts_score_groups_with_art_rewards_and_the_batchs_judge(request_for):
    with FakeJudge([0.3, 0.8]) as judge:
        results = run_rollouts(judged_request(request_for, WITH_REWARD, judge, reward=ART_SCORE_GROUP.format(args="")))
    for group in results:
        assert group.errors == [] and group.rewards == [0.3, 0.8]
    assert {r["body"]["model"] for r in judge.requests} == {"judge-model"}


def test_art_rewards_takes_a_litellm_style_judge_name_and_refuses_one_out_of_reach(request_for):
    with FakeJudge([0.3, 0.8]) as judge:
        ok = run_rollouts(
            judged_request(
                request_for,
                WITH_REWARD,
                judge,
                scenarios=[{"i": 0}],
                reward=ART_SCORE_GROUP.format(args=', "hosted_vllm/judge-model"'),
            )
        )
        refused = run_rollouts(
            judged_request(
                request_for,
                WITH_REWARD,
                judge,
                scenarios=[{"i": 0}],
                reward=ART_SCORE_GROUP.format(args=', "openai/o3"'),
            )
        )
    assert ok[0].rewards == [0.3, 0.8]
    error = refused[0].errors[0]
    assert "The judge model `openai/o3` is not available" in error
    assert "This batch may use: run-7@3, judge-model" in error


def test_art_rewards_ruler_scores_message_lists():
    async def main():
        return await sdk.ruler(
            [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]],
            extra_litellm_params={"temperature": 0.5, "api_base": "http://elsewhere"},
        )

    with FakeJudge([0.1, 0.6]) as judge, pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_BASE_URL", judge.base_url)
        mp.setenv(sdk.JUDGE_ENV, "judge-model")
        scores = asyncio.run(main())
    assert [(s.trajectory_id, s.score) for s in scores] == [("1", 0.1), ("2", 0.6)]
    [request] = judge.requests
    assert request["body"]["temperature"] == 0.5 and "api_base" not in request["body"]


def test_art_rewards_without_a_judge_says_how_to_get_one(monkeypatch):
    monkeypatch.delenv(sdk.JUDGE_ENV, raising=False)
    with pytest.raises(sdk.RulerError, match="Turn on RULER in the run's settings"):
        asyncio.run(sdk.ruler([[{"role": "user", "content": "a"}]]))


def test_import_art_brings_art_rewards():
    import subprocess

    code = f"import sys; sys.path.insert(0, {str(GUEST)!r}); import art; print(art.rewards.ruler_score_group.__name__)"
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ruler_score_group"


# --- a real judge ----------------------------------------------------------------------------------

FIXED_ANSWERS = """
import art

ANSWERS = ["4", "I like turtles.", "2 + 2 = 4, so the answer is 4."]

async def rollout(model, scenario):
    rollout.n = getattr(rollout, "n", -1) + 1
    return art.Trajectory(messages_and_choices=[
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": ANSWERS[rollout.n % 3]}])
"""


@pytest.mark.vllm
def test_the_base_model_judges_a_batch_through_the_proxy(vllm_server, request_for):
    base = vllm_server.ensure_base()
    request = request_for(
        FIXED_ANSWERS,
        scenarios=[{"question": "2 + 2"}],
        group_size=3,
        base_url=vllm_server.base_url,
        api_key=vllm_server.api_key,
        model_name=base,
        judge_model=base,
        ruler=True,
        rollout_timeout_s=240,
    )
    [group] = run_rollouts(request)
    assert group.errors == []
    for t in group.trajectories:
        assert 0.0 <= t["reward"] <= 1.0 and t["metrics"]["ruler_score"] == t["reward"]
        assert isinstance(t["metadata"]["ruler_explanation"], str)
    assert group.judge_s > 0
    json.dumps(group.to_dict())
