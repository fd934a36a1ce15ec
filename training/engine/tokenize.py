"""Trajectory → token ids, trainable mask and sampler log-probs.

The conversation is rendered with the model's own chat template (tools included), the way the inference
server rendered it. Each assistant turn the policy generated is replaced by the exact token ids the
sampler drew, with their recorded log-probs, so nothing the policy produced is re-tokenized (a re-encode
of the same text can split differently, and the old log-probs would then belong to other tokens).

A trajectory's additional histories (ART's `Trajectory.additional_histories`: conversations beside its main
one) are tokenized the same way, each into a sequence of its own (trajectory_histories), as ART does.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any


class TrajectoryError(ValueError):
    """A trajectory that cannot be turned into training tokens; the message says which and why."""


@dataclass
class TokenizedSequence:
    input_ids: list[int]  # [L] the rendered conversation, sampled tokens spliced in
    trainable: list[bool]  # [L] True where the token was sampled by the policy
    old_logprobs: list[float]  # [L] the sampler's log-prob at trainable positions, 0.0 elsewhere
    truncated: bool = False  # cut to max_seq_len
    advantage: float = 0.0
    # Where the sequence came from: (group index, trajectory index), for the caller's bookkeeping.
    source: tuple[int, int] = field(default=(-1, -1))

    @property
    def n_trainable(self) -> int:
        """Tokens that get a loss: sampled ones with a position before them to predict them from."""
        return sum(self.trainable[1:])


def trajectory_histories(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversations a trajectory trains, each a {"messages", "tools"} dict tokenize_trajectory takes: the
    trajectory itself, then each of its additional histories. As in ART, each becomes a sequence of its own
    that carries the trajectory's advantage; their message dicts are the trajectory's own, not copies."""
    extra = trajectory.get("additional_histories") or []
    return [trajectory, *({"messages": h.get("messages") or [], "tools": h.get("tools")} for h in extra)]


def is_trainable_turn(message: dict[str, Any]) -> bool:
    """An assistant turn the policy sampled: it carries the sampler's token ids."""
    return message.get("role") == "assistant" and message.get("token_ids") is not None


# Placeholder text for sampled turn k; random per process so no conversation contains it by chance,
# fixed within it so trajectories sharing a prompt render the same text (and share `encode_cache`).
_PLACEHOLDER = "ZQX" + uuid.uuid4().hex + "TURN{}"


def tokenize_trajectory(
    tokenizer: Any, trajectory: dict[str, Any], max_seq_len: int, encode_cache: dict[str, list[int]] | None = None
) -> TokenizedSequence:
    """Render, splice the sampled turns in, truncate to max_seq_len.

    The conversation is rendered up to its last sampled turn (what follows trains nothing) with a
    placeholder in place of each sampled turn. The text between placeholders is tokenized as it would be
    for the inference request; the placeholders become the sampled token ids. `encode_cache` (text →
    ids) saves re-encoding the prompt every trajectory of a group shares.
    """
    messages = list(trajectory.get("messages") or [])
    turn_idx = [i for i, m in enumerate(messages) if is_trainable_turn(m)]
    for i in turn_idx:
        _check_turn(messages[i], i)
    if not turn_idx:
        return TokenizedSequence(input_ids=[], trainable=[], old_logprobs=[])
    messages = messages[: turn_idx[-1] + 1]
    placeholders = [_PLACEHOLDER.format(k) for k in range(len(turn_idx))]
    rendered_msgs = [_render_message(m) for m in messages]
    for i, ph in zip(turn_idx, placeholders, strict=False):
        rendered_msgs[i] = {"role": "assistant", "content": ph}
    text = tokenizer.apply_chat_template(
        rendered_msgs, tools=trajectory.get("tools") or None, tokenize=False, add_generation_prompt=False
    )
    segments = _split_on(text, placeholders)
    special = set(tokenizer.all_special_ids)

    ids: list[int] = []
    trainable: list[bool] = []
    old: list[float] = []
    for k, segment in enumerate(segments[:-1]):  # the tail after the last sampled turn is dropped
        seg_ids = encode_cache.get(segment) if encode_cache is not None else None
        if seg_ids is None:
            seg_ids = tokenizer.encode(segment, add_special_tokens=False)
            if encode_cache is not None:
                encode_cache[segment] = seg_ids
        # The sampler usually returns the end-of-turn token it stopped on; the template writes it again
        # right after the placeholder. Keep the sampled copy only, so the sequence is what the model saw.
        if k > 0 and ids and seg_ids and seg_ids[0] == ids[-1] and seg_ids[0] in special:
            seg_ids = seg_ids[1:]
        ids += seg_ids
        trainable += [False] * len(seg_ids)
        old += [0.0] * len(seg_ids)
        turn = messages[turn_idx[k]]
        ids.extend(map(int, turn["token_ids"]))
        trainable.extend([True] * len(turn["token_ids"]))
        old.extend(map(float, turn["logprobs"]))

    truncated = len(ids) > max_seq_len
    if truncated:
        ids, trainable, old = ids[:max_seq_len], trainable[:max_seq_len], old[:max_seq_len]
    return TokenizedSequence(input_ids=ids, trainable=trainable, old_logprobs=old, truncated=truncated)


def _check_turn(message: dict[str, Any], index: int) -> None:
    token_ids, logprobs = message.get("token_ids"), message.get("logprobs")
    if logprobs is None or len(logprobs) != len(token_ids):
        raise TrajectoryError(
            f"message {index}: an assistant turn with token_ids needs logprobs of the same length "
            f"(got {len(token_ids)} token ids and {'no' if logprobs is None else len(logprobs)} logprobs); "
            "request logprobs from the inference server for every completion"
        )


def _render_message(message: dict[str, Any]) -> dict[str, Any]:
    """A context message as the inference server hands it to the chat template.

    None content becomes "" (templates concatenate it), and tool-call arguments sent as JSON strings
    (OpenAI style) become dicts, as chat templates expect.
    """
    out = {k: v for k, v in message.items() if k not in ("token_ids", "logprobs")}
    if out.get("content") is None:
        out["content"] = ""
    if out.get("tool_calls"):
        out["tool_calls"] = [_parse_arguments(call) for call in out["tool_calls"]]
    return out


def _parse_arguments(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function") or {}
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            return call
        return {**call, "function": {**fn, "arguments": parsed}}
    return call


def _split_on(text: str, placeholders: list[str]) -> list[str]:
    """text → len(placeholders)+1 segments around the placeholders, which must appear once each, in order."""
    segments, rest = [], text
    for n, ph in enumerate(placeholders):
        before, found, after = rest.partition(ph)
        if not found or ph in after:
            raise TrajectoryError(
                f"the chat template did not render sampled assistant turn {n} verbatim, so its tokens "
                "cannot be placed; use a model whose chat template keeps assistant content as is"
            )
        segments.append(before)
        rest = after
    segments.append(rest)
    return segments


def is_unsampled_turn(message: dict[str, Any]) -> bool:
    """An assistant turn the policy sampled whose token ids or log-probs did not come with it (a client
    that asked for neither): complete_sampled_turns gives it both before the update."""
    return (
        message.get("role") == "assistant"
        and bool(message.get("sampled"))
        and (message.get("token_ids") is None or message.get("logprobs") is None)
    )


def encode_sampled_turn(tokenizer: Any, messages: list[dict[str, Any]], index: int, tools: list | None) -> list[int]:
    """The token ids of assistant turn `index` as the chat template writes it after the generation prompt,
    up to its end-of-turn token: what the sampler would have drawn, for a turn that came without its ids.

    The template renders the conversation up to the turn twice, with the turn and with a generation prompt
    in its place; the difference is the turn. A template that does not render the prompt as a prefix gets
    the content's own tokens and the end-of-sequence token.
    """
    rendered = [_render_message(m) for m in messages[: index + 1]]
    kwargs = {"tools": tools or None, "tokenize": False}
    full = tokenizer.apply_chat_template(rendered, add_generation_prompt=False, **kwargs)
    prompt = tokenizer.apply_chat_template(rendered[:-1], add_generation_prompt=True, **kwargs)
    eos = tokenizer.eos_token or ""
    if full.startswith(prompt):
        turn = full[len(prompt) :]
        if eos and eos in turn:
            turn = turn[: turn.index(eos) + len(eos)]  # what follows the end-of-turn token was never sampled
        return tokenizer.encode(turn, add_special_tokens=False)
    ids = tokenizer.encode(rendered[-1].get("content") or "", add_special_tokens=False)
    return ids + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])


def complete_sampled_turns(trainer: Any, groups: list[list[dict]]) -> int:
    """Give each sampled turn that came without token ids the ids the chat template writes for it, and
    each without log-probs the current policy's (the client sampled from it: the update's ratio starts
    at 1), in every conversation of each trajectory (trajectory_histories). Returns how many turns were
    completed."""
    pending: list[dict] = []
    completed = 0
    for traj in (h for group in groups for t in group for h in trajectory_histories(t)):
        messages = traj.get("messages") or []
        for i, message in enumerate(messages):
            if not is_unsampled_turn(message):
                continue
            if message.get("token_ids") is None:
                message["token_ids"] = message.pop("sampled_token_ids", None) or encode_sampled_turn(
                    trainer.tokenizer, messages, i, traj.get("tools")
                )
            message["logprobs"] = [0.0] * len(message["token_ids"])
            message["_fill"] = True
            completed += 1
            if not pending or pending[-1] is not traj:
                pending.append(traj)
    for traj, values in zip(pending, trainer.logprobs(pending) if pending else [], strict=True):
        at = 0  # the trainable positions: the sampled turns' tokens, in order (cut to max_seq_len)
        for message in filter(is_trainable_turn, traj["messages"]):
            n = len(message["token_ids"])
            if message.pop("_fill", False):
                chunk = values[at : at + n]
                message["logprobs"] = [float(v) for v in chunk] + [0.0] * (n - len(chunk))
            at += n
    return completed
