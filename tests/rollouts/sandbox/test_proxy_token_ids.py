"""Token ids whatever client the script builds: the inference proxy asks the worker's own servers for the
sampled token ids and log-probabilities on every chat completion, so a rollout that builds its own
AsyncOpenAI (as ART's notebooks do) records the sampled tokens exactly as an SDK rollout does.

The rule on its own; the proxy against a small real server that answers as vLLM does (token ids and
log-probabilities only when asked); scripts in the real jail that forge or inflate those fields; and a
notebook-style and an SDK rollout side by side on the session's real vLLM and CTranslate2 servers.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import httpx
import openai
import pytest
from aiohttp import web

from rollouts.sandbox.egress import EgressPolicy
from rollouts.sandbox.proxy import InferenceProxy, Upstream
from rollouts.sandbox.proxy_rules import MAX_TOP_LOGPROBS, asking_sampled_tokens, check_fields
from rollouts.sandbox.rollouts import run_rollouts
from tests.rollouts.sandbox.threaded_server import ThreadedServer

MODEL = "run-1@3"
# What the stand-in server "samples": three tokens and their log-probabilities.
TOKEN_IDS = [101, 7, 2]
LOGPROBS = [-0.25, -1.5, -0.125]
CAPS = {"n": 16, "max_tokens": 64}


class SamplingServer(ThreadedServer):
    """Answers chat completions as vLLM does: a choice's `token_ids` (and the prompt's) only when the
    request sets return_token_ids, its log-probabilities only when it sets logprobs. Records every body."""

    def __init__(self) -> None:
        super().__init__("sampling-server")
        self.requests: list[dict] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completion)

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        entries = [
            {"token": f"t{i}", "logprob": lp, "bytes": None, "top_logprobs": []} for i, lp in enumerate(LOGPROBS)
        ]
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": "ok"},
            "finish_reason": "stop",
            "logprobs": {"content": entries} if body.get("logprobs") else None,
        }
        answer = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"]}
        if body.get("return_token_ids"):
            choice["token_ids"] = TOKEN_IDS
            answer["prompt_token_ids"] = [1, 2, 3]
        usage = {"prompt_tokens": 3, "completion_tokens": len(TOKEN_IDS), "total_tokens": 3 + len(TOKEN_IDS)}
        return web.json_response({**answer, "choices": [choice], "usage": usage})

    async def _completion(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        choice = {"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}
        return web.json_response({"id": "cmpl-1", "object": "text_completion", "created": 0, "choices": [choice]})


@pytest.fixture
def upstream():
    with SamplingServer() as server:
        yield server


@pytest.fixture
def socket_dir():
    # Not tmp_path: a unix socket's path must stay under 108 bytes.
    path = Path(tempfile.mkdtemp(prefix="artweb-tokens-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def proxy():
    proxy = InferenceProxy()
    yield proxy
    proxy.shutdown()


def open_socket(proxy: InferenceProxy, socket_dir: Path, upstream: Upstream) -> Path:
    path = socket_dir / "batch.sock"
    proxy.open(path, {MODEL: upstream})
    return path


def notebook_client(path: Path) -> openai.OpenAI:
    """An OpenAI client built as a notebook builds it: the endpoint and a key, no SDK transport."""
    transport = httpx.HTTPTransport(uds=str(path))
    return openai.OpenAI(
        base_url="http://proxy/v1", api_key="sk-x", max_retries=0, http_client=httpx.Client(transport=transport)
    )


def chat(**extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


# --- the rule ---------------------------------------------------------------------------------------


def test_it_asks_for_sampled_tokens_on_every_chat_completion_over_what_the_caller_set():
    body = chat(logprobs=False, return_token_ids=False, top_logprobs=0)
    asked = asking_sampled_tokens(body, "/chat/completions")
    assert asked == {**body, "logprobs": True, "return_token_ids": True}
    assert asking_sampled_tokens(chat(), "/chat/completions") == {**chat(), "logprobs": True, "return_token_ids": True}
    assert body["logprobs"] is False  # the caller's dict is left as it was
    legacy = {"model": MODEL, "prompt": "hi", "logprobs": 2}
    assert asking_sampled_tokens(legacy, "/completions") == legacy  # ART trains chat choices only


@pytest.mark.parametrize(
    "suffix, field, value, passes",
    [
        ("/chat/completions", "top_logprobs", 0, True),
        ("/chat/completions", "top_logprobs", MAX_TOP_LOGPROBS, True),
        ("/chat/completions", "top_logprobs", MAX_TOP_LOGPROBS + 1, False),
        ("/chat/completions", "top_logprobs", 10**6, False),
        ("/chat/completions", "top_logprobs", -1, False),  # vLLM: the whole vocabulary
        ("/chat/completions", "top_logprobs", "5", False),
        ("/chat/completions", "top_logprobs", 2.5, False),
        ("/completions", "logprobs", 5, True),
        ("/completions", "logprobs", True, True),
        ("/completions", "logprobs", 10**6, False),
        ("/completions", "logprobs", -1, False),
    ],
)
def test_it_bounds_the_alternatives_per_token_a_request_may_ask_for(suffix, field, value, passes):
    body = {"model": MODEL, field: value}
    refused = check_fields(body, suffix, CAPS)
    if passes:
        assert refused is None
    else:
        assert refused.status == 400
        assert f"{field} must be a whole number from 0 to {MAX_TOP_LOGPROBS} (the proxy's limit" in refused.text


# --- the proxy ---------------------------------------------------------------------------------------


def test_a_notebook_client_gets_the_sampled_token_ids_and_logprobs(proxy, socket_dir, upstream):
    """The script asked for neither; the choice it gets carries both, as the SDK client's does."""
    path = open_socket(proxy, socket_dir, Upstream(upstream.base_url))
    completion = notebook_client(path).chat.completions.create(**chat(max_tokens=8))
    [choice] = completion.choices
    assert choice.model_extra["token_ids"] == TOKEN_IDS
    assert [entry.logprob for entry in choice.logprobs.content] == LOGPROBS
    assert completion.model_extra["prompt_token_ids"] == [1, 2, 3]
    assert upstream.requests == [chat(max_tokens=8, logprobs=True, return_token_ids=True)]


def test_a_script_that_turns_them_off_still_gets_them(proxy, socket_dir, upstream):
    path = open_socket(proxy, socket_dir, Upstream(upstream.base_url))
    completion = notebook_client(path).chat.completions.create(
        **chat(logprobs=False), extra_body={"return_token_ids": False}
    )
    assert completion.choices[0].model_extra["token_ids"] == TOKEN_IDS
    assert upstream.requests[0]["logprobs"] is True and upstream.requests[0]["return_token_ids"] is True


@pytest.mark.parametrize(
    "forged, code",
    [
        ({"token_ids": [5, 5, 5]}, "field_not_allowed"),
        ({"prompt_token_ids": [5, 5, 5]}, "field_not_allowed"),
        ({"logprob_token_ids": [5]}, "field_not_allowed"),
        ({"prompt_logprobs": 20}, "field_not_allowed"),
        ({"top_logprobs": 10**6}, "value_out_of_range"),
        ({"top_logprobs": -1}, "value_out_of_range"),
    ],
)
def test_forged_token_fields_and_huge_logprobs_never_reach_the_server(proxy, socket_dir, upstream, forged, code):
    path = open_socket(proxy, socket_dir, Upstream(upstream.base_url))
    transport = httpx.HTTPTransport(uds=str(path))
    with httpx.Client(transport=transport, base_url="http://proxy/v1") as client:
        response = client.post("/chat/completions", json=chat(**forged))
    assert response.status_code == 400 and response.json()["error"]["code"] == code
    assert upstream.requests == []


def test_legacy_completions_and_a_users_server_get_the_request_as_sent(proxy, socket_dir, upstream):
    """A judge endpoint a user named may be any OpenAI-compatible API (one that refuses return_token_ids),
    and what it answers is never trained on."""
    users = socket_dir / "users.sock"
    proxy.open(users, {MODEL: Upstream(upstream.base_url, egress=EgressPolicy.parse([f"127.0.0.1:{upstream.port}"]))})
    notebook_client(users).chat.completions.create(**chat())
    own = open_socket(proxy, socket_dir, Upstream(upstream.base_url))
    notebook_client(own).completions.create(model=MODEL, prompt="hi", logprobs=2)
    assert upstream.requests == [chat(), {"model": MODEL, "prompt": "hi", "logprobs": 2}]


# --- in the jail --------------------------------------------------------------------------------------

NOTEBOOK_ROLLOUT = """
import art, httpx
from openai import AsyncOpenAI, BadRequestError


async def rollout(model, scenario):
    client = AsyncOpenAI(base_url=model.inference_base_url, api_key=model.inference_api_key)
    messages = [{"role": "user", "content": "Say hi."}]
    refused = {}
    if scenario.forge:
        # A script that turns token ids off, asks for huge alternatives, or sends token ids of its own.
        for name, extra in (("top", {"top_logprobs": 10**6}), ("ids", {"prompt_token_ids": [1] * 8})):
            try:
                await client.chat.completions.create(model=model.name, messages=messages, extra_body=extra)
            except BadRequestError as exc:
                refused[name] = exc.body["code"]
        asked = {"logprobs": False, "extra_body": {"return_token_ids": False}}
    else:
        asked = {}
    completion = await client.chat.completions.create(model=model.name, messages=messages, **asked)
    return art.Trajectory(
        messages_and_choices=[*messages, completion.choices[0]], reward=1.0, metadata={"refused": refused}
    )
"""


def test_a_notebook_style_rollout_records_the_sampled_tokens_in_the_jail(request_for, upstream):
    [plain, forging] = run_rollouts(
        request_for(
            NOTEBOOK_ROLLOUT,
            scenarios=[{"forge": False}, {"forge": True}],
            group_size=1,
            base_url=upstream.base_url,
            model_name=MODEL,
        )
    )
    for group in (plain, forging):
        [t] = group.trajectories
        assert t["error"] is None, t["error"]
        assistant = t["messages"][-1]
        assert assistant["token_ids"] == TOKEN_IDS and assistant["logprobs"] == LOGPROBS
        assert assistant["finish_reason"] == "stop"
    assert plain.trajectories[0]["metadata"]["refused"] == {}
    assert forging.trajectories[0]["metadata"]["refused"] == {"top": "value_out_of_range", "ids": "field_not_allowed"}
    # The two refused requests never reached the server; both answered ones asked for the sampled tokens.
    assert len(upstream.requests) == 2
    assert all(r["logprobs"] is True and r["return_token_ids"] is True for r in upstream.requests)


# --- on the real inference servers ---------------------------------------------------------------------

SIDE_BY_SIDE_ROLLOUT = """
import art
from openai import AsyncOpenAI


async def rollout(model, scenario):
    if scenario.client == "sdk":
        client = model.openai_client()
    else:  # as ART's notebooks build it
        client = AsyncOpenAI(base_url=model.inference_base_url, api_key=model.inference_api_key)
    messages = [{"role": "user", "content": "Name three fruits."}]
    completion = await client.chat.completions.create(
        model=model.name, messages=messages, max_tokens=12, temperature=0.0
    )
    return art.Trajectory(
        messages_and_choices=[*messages, completion.choices[0]],
        reward=1.0,
        metadata={"completion_tokens": completion.usage.completion_tokens},
    )
"""


@pytest.mark.slow
def test_a_notebook_client_records_what_the_sdk_client_records(inference_server, request_for):
    """Greedy, one rollout at a time: the notebook client's turn carries the very token ids the SDK
    client's does, with their log-probabilities, on both inference servers."""
    own, sdk = run_rollouts(
        request_for(
            SIDE_BY_SIDE_ROLLOUT,
            scenarios=[{"client": "own"}, {"client": "sdk"}],
            group_size=1,
            base_url=inference_server.base_url,
            api_key=inference_server.api_key,
            model_name=inference_server.ensure_base(),
            concurrency=1,
            rollout_timeout_s=300,
        )
    )
    [mine], [theirs] = own.trajectories, sdk.trajectories
    assert mine["error"] is None and theirs["error"] is None, (mine["error"], theirs["error"])
    turn, reference = mine["messages"][-1], theirs["messages"][-1]
    assert sorted(turn) == sorted(reference)
    assert turn["token_ids"] and len(turn["token_ids"]) == mine["metadata"]["completion_tokens"]
    assert len(turn["logprobs"]) == len(turn["token_ids"]) and all(lp <= 0 for lp in turn["logprobs"])
    assert turn["token_ids"] == reference["token_ids"] and turn["content"] == reference["content"]
    assert turn["logprobs"] == pytest.approx(reference["logprobs"], abs=0.05)
