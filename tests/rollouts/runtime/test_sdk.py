"""The SDK rollout scripts import (`art` / `artweb_sdk`), exercised in-process without a server."""

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from openai.types.chat.chat_completion import ChatCompletion

GUEST = Path(__file__).resolve().parents[3] / "rollouts" / "runtime" / "guest"
sys.path.insert(0, str(GUEST))

import artweb_sdk as art  # noqa: E402 - importable once the guest directory is on sys.path

COMPLETION = {
    "id": "c1",
    "object": "chat.completion",
    "created": 0,
    "model": "run-1@1",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "token_ids": [10, 11, 2],
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
                ],
            },
            "logprobs": {
                "content": [
                    {"token": t, "logprob": lp, "bytes": None, "top_logprobs": []}
                    for t, lp in (("a", -0.5), ("b", -1.0), ("<|im_end|>", -0.1))
                ]
            },
        }
    ],
}


def test_it_keeps_token_ids_and_logprobs_of_appended_choices():
    choice = ChatCompletion.model_validate(COMPLETION).choices[0]
    trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}], reward=0.5)
    trajectory.messages_and_choices.append(choice)
    trajectory.messages_and_choices.append({"role": "tool", "tool_call_id": "call_1", "content": "found"})
    record = trajectory.to_record()
    user, assistant, tool = record["messages"]
    assert user == {"role": "user", "content": "hi"}
    assert assistant["token_ids"] == [10, 11, 2] and assistant["logprobs"] == [-0.5, -1.0, -0.1]
    assert assistant["finish_reason"] == "tool_calls" and assistant["content"] == ""
    assert assistant["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"q": "x"}'}
    assert tool == {"role": "tool", "content": "found", "tool_call_id": "call_1"}
    # What a script passes back to the API on the next turn: plain messages, no sampling details.
    assert "token_ids" not in trajectory.messages()[1]


def test_scenarios_have_attribute_and_item_access():
    scenario = art.Scenario({"prompt": "p", "meta": {"level": 2}, "steps": [{"a": 1}]})
    assert scenario.prompt == scenario["prompt"] == "p"
    assert scenario.meta.level == 2 and scenario.steps[0].a == 1
    with pytest.raises(AttributeError, match="no field 'missing'"):
        _ = scenario.missing


def test_gather_trajectory_groups_keeps_failures_in_their_group():
    async def ok(reward):
        return art.Trajectory(reward=reward)

    async def boom():
        raise ValueError("no")

    async def main():
        groups = await art.gather_trajectory_groups(
            [art.TrajectoryGroup([ok(1.0), boom()]), art.TrajectoryGroup(ok(r) for r in (0.0, 0.5))], max_exceptions=1
        )
        assert [len(g) for g in groups] == [1, 2] and isinstance(groups[0].exceptions[0], ValueError)
        with pytest.raises(art.TooManyExceptions):
            await art.gather_trajectory_groups([art.TrajectoryGroup([boom(), boom()])], max_exceptions=1)

    asyncio.run(main())


def test_art_scripts_import_even_without_weave(tmp_path):
    # The stand-in sits last on the sandbox's path, behind any real weave. Here a finder hides the real
    # one (if this environment has it) so the import falls through to the stand-in.
    fallbacks = GUEST.parent / "guest_fallbacks"
    code = f"""
import importlib.machinery, sys
sys.path.insert(0, {str(GUEST)!r})
sys.path.append({str(fallbacks)!r})

class WithoutRealWeave:
    def find_spec(self, name, path=None, target=None):
        if name == "weave":
            return importlib.machinery.PathFinder.find_spec(name, [{str(fallbacks)!r}])

sys.meta_path.insert(0, WithoutRealWeave())
import art, weave

@weave.op
async def rollout(model, scenario):
    return art.Trajectory(reward=1.0)

weave.init("project")
print(weave.__file__.endswith("guest_fallbacks/weave/__init__.py"), type(art.TrainableModel(name="m")).__name__)
"""
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "TrainableModel"]
