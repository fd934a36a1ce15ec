"""The OpenAI-compatible endpoint end to end: the official `openai` client, the ASGI app, Redis, the
serving thread and a real vLLM server (CPU build, default model), for a base model and a checkpoint."""

import httpx
import openai
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

MESSAGES = [{"role": "user", "content": "Name a colour."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def _client(web, token):
    return openai.OpenAI(base_url=f"{web.url}/api/v1/openai", api_key=token, max_retries=0, timeout=300)


def test_it_serves_a_base_model_and_a_checkpoint_to_the_openai_client(served_run, serving_worker, web, vllm_server):
    serving_worker(served_run["model"])
    run, base = served_run["run"], served_run["model"].name
    client = _client(web, served_run["alice_token"])

    names = {m.id for m in client.models.list()}
    assert {base, f"run-{run.id}@1", f"run-{run.id}@latest", f"run-{run.id}@best"} <= names

    answer = client.chat.completions.create(
        model=base, messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2
    )
    assert answer.model == base
    assert answer.choices[0].message.content
    tokens = answer.choices[0].logprobs.content
    assert tokens and all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in tokens)

    # A checkpoint, streamed: the answer arrives in chunks, each naming the model as asked.
    chunks = list(
        client.chat.completions.create(
            model=f"run-{run.id}@latest", messages=MESSAGES, max_tokens=8, temperature=0, stream=True
        )
    )
    assert len(chunks) > 2 and {c.model for c in chunks} == {f"run-{run.id}@latest"}
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # It is the checkpoint's adapter that answered: vLLM asked directly under the adapter's name agrees,
    # and the base model says something else. (A server with runtime adapters holds the endpoint's under
    # names of their own: SERVING_PREFIX.)
    [loaded] = [name for name in vllm_server.adapters if name.endswith(f"run-{run.id}@1")]
    direct = httpx.post(
        f"{vllm_server.base_url}/chat/completions",
        headers=vllm_server.headers,
        json={"model": loaded, "messages": MESSAGES, "max_tokens": 8, "temperature": 0},
        timeout=120,
    ).json()
    assert streamed == direct["choices"][0]["message"]["content"]
    assert streamed != answer.choices[0].message.content

    # A tool call (the tool is named, so the model must call it), streamed back as OpenAI streams one.
    called = client.chat.completions.create(
        model=base,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=128,
        temperature=0,
    )
    assert called.choices[0].message.tool_calls, called
    call = called.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and call.function.arguments.startswith("{")
    streamed_call = list(
        client.chat.completions.create(
            model=base,
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=128,
            temperature=0,
            stream=True,
        )
    )
    names = [t.function.name for c in streamed_call if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert "get_weather" in names

    # An alias (which promotes the checkpoint) is a model name too.
    aliased = httpx.post(
        f"{web.url}/api/v1/checkpoints/{served_run['checkpoint'].id}/alias/",
        headers={"Authorization": f"Token {served_run['alice_token']}"},
        json={"alias": "colour-agent"},
    )
    assert aliased.status_code == 200, aliased.text
    via_alias = client.chat.completions.create(model="colour-agent", messages=MESSAGES, max_tokens=8, temperature=0)
    assert via_alias.model == "colour-agent" and via_alias.choices[0].message.content == streamed
    served_run["checkpoint"].refresh_from_db()
    assert served_run["checkpoint"].promoted


def test_it_answers_404_for_another_users_checkpoint(served_run, serving_worker, web):
    serving_worker(served_run["model"])
    run = served_run["run"]
    bob = _client(web, served_run["bob_token"])
    for name in (f"run-{run.id}@1", f"run-{run.id}@latest", run.name + "@best", "no-such-model"):
        with pytest.raises(openai.NotFoundError) as caught:
            bob.chat.completions.create(model=name, messages=MESSAGES, max_tokens=4)
        error = caught.value.response.json()["error"]
        assert error["code"] == "model_not_found" and error["param"] == "model", error
    assert f"run-{run.id}@1" not in {m.id for m in bob.models.list()}
    # The shared base model is bob's to use.
    assert bob.chat.completions.create(model=served_run["model"].name, messages=MESSAGES, max_tokens=4).choices

    with pytest.raises(openai.AuthenticationError):
        _client(web, "not-a-token").chat.completions.create(model="x", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError) as caught:
        bob.chat.completions.create(model=served_run["model"].name, messages=[], max_tokens=4)
    assert "messages" in caught.value.response.json()["error"]["message"]
