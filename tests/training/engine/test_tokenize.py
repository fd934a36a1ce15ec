"""Trajectory → tokens with the real SmolLM2 tokenizer and chat template."""

import pytest

from training.engine.tokenize import TrajectoryError, tokenize_trajectory

from .conftest import completion

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def tool_trajectory(tokenizer):
    call = completion(
        tokenizer, '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>', logprob=-0.5
    )
    call.update(
        content=None,
        tool_calls=[
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    )
    answer = completion(tokenizer, "It is sunny in Paris.", logprob=-0.25)
    return {
        "messages": [
            {"role": "system", "content": "You are a weather bot."},
            {"role": "user", "content": "Weather in Paris?"},
            call,
            {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "sunny, 21C"},
            answer,
            {"role": "user", "content": "Thanks!"},  # after the last sampled turn: trains nothing, dropped
        ],
        "tools": TOOLS,
        "reward": 1.0,
    }


def test_it_trains_only_the_sampled_assistant_tokens_of_a_tool_calling_trajectory(tokenizer):
    traj = tool_trajectory(tokenizer)
    call_ids, answer_ids = traj["messages"][2]["token_ids"], traj["messages"][4]["token_ids"]
    seq = tokenize_trajectory(tokenizer, traj, max_seq_len=4096)

    trained = [t for t, m in zip(seq.input_ids, seq.trainable, strict=False) if m]
    assert trained == call_ids + answer_ids  # the sampled ids, as is, nothing else
    assert [lp for lp, m in zip(seq.old_logprobs, seq.trainable, strict=False) if m] == [-0.5] * len(call_ids) + [
        -0.25
    ] * len(answer_ids)
    assert not any(m for t, m in zip(seq.input_ids, seq.trainable, strict=False) if t not in call_ids + answer_ids)

    # The prompt is what the inference server renders for the first request (generation prompt on).
    prompt = tokenizer.apply_chat_template(
        traj["messages"][:2], tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert seq.input_ids[: len(prompt_ids)] == prompt_ids and not any(seq.trainable[: len(prompt_ids)])

    # The tool result sits between the two turns, masked; <|im_end|> is not doubled after a turn.
    text = tokenizer.decode(seq.input_ids)
    assert "<|im_start|>tool\nsunny, 21C<|im_end|>" in text and "<|im_end|><|im_end|>" not in text
    assert "Thanks!" not in text
    assert seq.n_trainable == len(call_ids) + len(answer_ids) and not seq.truncated


def test_it_truncates_long_sequences_and_says_so(tokenizer):
    traj = tool_trajectory(tokenizer)
    full = tokenize_trajectory(tokenizer, traj, max_seq_len=4096)
    cut = tokenize_trajectory(tokenizer, traj, max_seq_len=len(full.input_ids) - 3)
    assert cut.truncated and cut.input_ids == full.input_ids[:-3]
    assert cut.n_trainable == full.n_trainable - 3


def test_assistant_turns_without_token_ids_are_context(tokenizer):
    traj = tool_trajectory(tokenizer)
    for m in traj["messages"]:
        m.pop("token_ids", None)
        m.pop("logprobs", None)
    seq = tokenize_trajectory(tokenizer, traj, max_seq_len=4096)
    assert seq.input_ids == [] and seq.n_trainable == 0


def test_it_rejects_turns_whose_logprobs_do_not_match(tokenizer):
    traj = tool_trajectory(tokenizer)
    traj["messages"][4]["logprobs"] = traj["messages"][4]["logprobs"][:-1]
    with pytest.raises(TrajectoryError, match="message 4"):
        tokenize_trajectory(tokenizer, traj, max_seq_len=4096)
