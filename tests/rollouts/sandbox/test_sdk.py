"""The SDK rollout scripts import (`art` / `artweb_sdk`), exercised in-process without a server."""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from openai.types.chat.chat_completion import ChatCompletion

GUEST = Path(__file__).resolve().parents[3] / "rollouts" / "sandbox" / "guest"
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


async def _serve_completions(socket_path: str, seen: list, *requests):
    """Serve COMPLETION on a unix socket while `requests` (coroutine functions) run; each request's line
    and JSON body go to `seen`. Returns what the requests returned or raised."""

    async def answer(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
        seen.append((head.split(b"\r\n")[0].decode(), json.loads(await reader.readexactly(length))))
        body = json.dumps({**COMPLETION, "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}})
        writer.write(
            f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode()
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(answer, socket_path)
    try:
        return await asyncio.gather(*(r() for r in requests), return_exceptions=True)
    finally:
        server.close()


def test_its_client_reaches_the_proxy_socket_itself_when_the_sandbox_names_one(tmp_path, monkeypatch):
    # base_url is the guest's TCP relay, here a port nothing listens on: a request can only arrive through
    # the unix socket, with the sampling defaults added on the way. A handle given another server's URL
    # keeps to that URL.
    import openai
    from artweb_sdk.model import Endpoint

    socket_path = str(tmp_path / "inference.sock")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("ARTWEB_PROXY_SOCKET", socket_path)
    monkeypatch.setenv("ARTWEB_SAMPLING", '{"max_tokens": 16}')
    policy = art.TrainableModel(name="run-1@1", _endpoint=Endpoint.from_env())
    elsewhere = art.TrainableModel(name="m", inference_base_url="http://127.0.0.1:10/v1", _endpoint=Endpoint.from_env())

    def ask(model):
        async def request():
            client = model.openai_client().with_options(max_retries=0)
            return await client.chat.completions.create(model=model.name, messages=[{"role": "user", "content": "hi"}])

        return request

    seen = []
    completion, failure = asyncio.run(_serve_completions(socket_path, seen, ask(policy), ask(elsewhere)))
    assert completion.choices[0].model_extra["token_ids"] == [10, 11, 2]
    [(request_line, body)] = seen
    assert request_line == "POST /v1/chat/completions HTTP/1.1"
    assert body["model"] == "run-1@1" and body["max_tokens"] == 16
    assert body["logprobs"] is True and body["return_token_ids"] is True
    assert isinstance(failure, openai.APIConnectionError)
