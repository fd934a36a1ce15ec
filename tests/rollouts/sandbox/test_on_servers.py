"""The sandbox against the session's real inference servers (default model): vLLM's CPU build and artweb's
CTranslate2 server, each test against both (`inference_server`): rollouts record what training needs,
dry runs return within their bound, and RULER judges with the base model."""

import json
import time

import pytest

from rollouts.sandbox.rollouts import dry_run, run_rollouts
from rollouts.sandbox.ruler import Judge, ruler_score_group

from .conftest import EXAMPLES

pytestmark = pytest.mark.vllm

# The rollout from ART's documentation, as a person would paste it (only `score` is theirs to write).
ART_DOC_ROLLOUT = """
import art, weave


def score(text, scenario):
    return float(scenario.word in (text or "").lower())


@weave.op
async def rollout(model: art.Model, scenario) -> art.Trajectory:
    client = model.openai_client()
    traj = art.Trajectory(messages_and_choices=[], reward=0.0)

    messages = [{"role": "user", "content": scenario.prompt}]
    completion = await client.chat.completions.create(
        model=model.name, messages=messages,
    )
    choice = completion.choices[0]
    traj.messages_and_choices.append(choice)

    traj.reward = score(choice.message.content, scenario)  # your reward fn
    return traj
"""


def assert_trainable(message: dict):
    assert message["role"] == "assistant"
    assert message["token_ids"] and all(isinstance(t, int) for t in message["token_ids"])
    assert len(message["logprobs"]) == len(message["token_ids"])
    assert all(lp <= 0 for lp in message["logprobs"])
    assert message["finish_reason"] in ("stop", "length", "tool_calls")


def test_it_records_token_ids_and_logprobs_of_the_example_task(inference_server, request_for):
    scenario = json.loads((EXAMPLES / "scenarios.jsonl").read_text().splitlines()[0])
    request = request_for(
        (EXAMPLES / "rollout.py").read_text(),
        reward=(EXAMPLES / "reward.py").read_text(),
        scenarios=[scenario],
        group_size=2,
        base_url=inference_server.base_url,
        api_key=inference_server.api_key,
        model_name=inference_server.ensure_base(),
        sampling={"max_tokens": 24, "temperature": 1.0},
    )
    [group] = run_rollouts(request)
    for t in group.trajectories:
        assert t["error"] is None, t["error"]
        assert [m["role"] for m in t["messages"]] == ["system", "user", "assistant"]
        assistant = t["messages"][-1]
        assert_trainable(assistant)
        assert t["completion_tokens"] == len(assistant["token_ids"]) <= 24
        assert t["prompt_tokens"] > 10
        assert 0.0 <= t["reward"] <= 1.0 and "words" in t["metrics"]
        json.dumps(t)  # what the database stores


def test_it_runs_the_art_documentation_rollout_unchanged(inference_server, request_for):
    request = request_for(
        ART_DOC_ROLLOUT,
        scenarios=[{"prompt": "Say hello.", "word": "hello"}],
        group_size=2,
        base_url=inference_server.base_url,
        api_key=inference_server.api_key,
        model_name=inference_server.ensure_base(),
        sampling={"max_tokens": 16},
    )
    [group] = run_rollouts(request)
    for t in group.trajectories:
        assert t["error"] is None, t["error"]
        assert t["reward"] in (0.0, 1.0)
        assert_trainable(t["messages"][0])


def test_it_records_every_turn_of_a_tool_calling_rollout(inference_server, request_for):
    request = request_for(
        (EXAMPLES / "tool_rollout.py").read_text(),
        scenarios=[{"country": "France", "capital": "Paris"}],
        group_size=1,
        base_url=inference_server.base_url,
        api_key=inference_server.api_key,
        model_name=inference_server.ensure_base(),
        # A forced call's envelope and arguments take some 35 tokens with this model.
        sampling={"max_tokens": 64, "temperature": 0.0},
        rollout_timeout_s=120,
    )
    [group] = run_rollouts(request)
    [t] = group.trajectories
    assert t["error"] is None, t["error"]
    roles = [m["role"] for m in t["messages"]]
    assert roles[:3] == ["system", "user", "assistant"] and "tool" in roles and roles[-1] == "assistant"
    call = t["messages"][2]["tool_calls"][0]
    assert call["function"]["name"] == "lookup_capital"
    assert isinstance(json.loads(call["function"]["arguments"]), dict)
    assert t["tools"][0]["function"]["name"] == "lookup_capital"
    for message in t["messages"]:
        if message["role"] == "assistant":
            assert_trainable(message)
    assert t["metrics"]["tool_calls"] >= 1


def test_a_dry_run_returns_output_within_its_time_bound(inference_server):
    started = time.monotonic()
    result = dry_run(
        script=(EXAMPLES / "rollout.py").read_text(),
        reward=(EXAMPLES / "reward.py").read_text(),
        scenarios=[json.loads(line) for line in (EXAMPLES / "scenarios.jsonl").read_text().splitlines()],
        base_url=inference_server.base_url,
        api_key=inference_server.api_key,
        model_name=inference_server.ensure_base(),
        sampling={"max_tokens": 16},
        timeout_s=120,
    )
    assert time.monotonic() - started < 130
    assert len(result["trajectories"]) == 3 and result["errors"] == []
    assert all(r is not None for r in result["rewards"])


def test_a_dry_run_of_a_broken_script_returns_its_errors(inference_server):
    started = time.monotonic()
    result = dry_run(
        script="import art\nasync def rollout(model, scenario):\n    while True:\n        pass\n",
        reward=None,
        scenarios=[{"x": 1}],
        base_url=inference_server.base_url,
        api_key=inference_server.api_key,
        model_name=inference_server.base_model_name,
        timeout_s=15,
    )
    assert time.monotonic() - started < 25
    assert len(result["errors"]) == 1 and "Timed out" in result["errors"][0]


def test_ruler_scores_a_group_with_the_base_model_as_judge(inference_server):
    def trajectory(answer, reward):
        return {
            "messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": answer}],
            "reward": reward,
            "metrics": {},
            "metadata": {},
            "error": None,
        }

    group = [trajectory("4", 1.0), trajectory("I like turtles.", 0.0)]
    # No max_tokens: the answer's schema bounds its length (two short explanations). A generous timeout:
    # on a busy 2-core machine this small judge writes a few tokens a second.
    judge = Judge(
        base_url=inference_server.base_url,
        model=inference_server.ensure_base(),
        api_key=inference_server.api_key,
        timeout_s=600,
    )
    ruler_score_group(group, judge)
    for t, independent in zip(group, (1.0, 0.0), strict=False):
        assert 0.0 <= t["reward"] <= 1.0
        assert t["metrics"]["independent_reward"] == independent
        assert t["metrics"]["ruler_score"] == t["reward"]
