"""Inference from inside the jail, against the real vLLM server: a client the script builds itself from
OPENAI_BASE_URL (through the guest's relay and the worker's proxy) streams, and the SDK's client
gets logprobs and token ids, as a run needs them."""

import pytest

from rollouts.sandbox.rollouts import run_rollouts

pytestmark = pytest.mark.vllm

OWN_CLIENT_STREAMING = """
import art, os
from openai import AsyncOpenAI

async def rollout(model, scenario):
    client = AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="anything")
    stream = await client.chat.completions.create(
        model=model.name, messages=[{"role": "user", "content": "Count from one to ten."}],
        max_tokens=24, stream=True)
    chunks, text = 0, ""
    async for chunk in stream:
        chunks += 1
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    completion = await model.openai_client().chat.completions.create(
        model=model.name, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8)
    return art.Trajectory(
        messages_and_choices=[{"role": "user", "content": "Say hi."}, completion.choices[0]],
        reward=1.0, metadata={"chunks": chunks, "text": text})
"""


def test_a_script_streams_through_its_own_client_and_the_sdk_gets_token_ids(request_for, vllm_server):
    results = run_rollouts(
        request_for(
            OWN_CLIENT_STREAMING,
            scenarios=[{}],
            group_size=2,
            base_url=vllm_server.base_url,
            api_key=vllm_server.api_key,
            model_name=vllm_server.ensure_base(),
            vocab_size=49152,
            rollout_timeout_s=300,
        )
    )
    for t in results[0].trajectories:
        assert t["error"] is None, t["error"]
        assert t["metadata"]["chunks"] > 3 and t["metadata"]["text"]  # a stream, not one buffered reply
        assistant = t["messages"][-1]
        assert assistant["token_ids"] and len(assistant["token_ids"]) == len(assistant["logprobs"])
        assert all(0 <= tok < 49152 for tok in assistant["token_ids"])
