"""What a sandbox sends back, checked before anything is stored or trained on.

The guest program runs in the same process as the user's code, so everything it writes is the user's
word: a record may claim any group, any reward, any token id. Each line is parsed without NaN or
Infinity and checked field by field here; a record that fails becomes that rollout's error.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_LINE_BYTES = 8 << 20  # one record; the guest keeps trajectories under 4 MB and replaces larger ones


class RecordError(ValueError):
    """A record from a sandbox breaks the protocol; the message says how."""


def _no_constants(name: str):
    raise RecordError(f"the record holds {name}, which JSON does not allow")


def parse_line(line: bytes, kinds: tuple[str, ...] = ("trajectory", "done")) -> dict:
    """One protocol line → a message dict ({"kind": one of kinds, ...}); a re-scoring batch sends "score"
    and "done" lines instead of trajectories."""
    try:
        message = json.loads(line, parse_constant=_no_constants)
    except RecordError:
        raise
    except ValueError as exc:
        raise RecordError(f"a line of its output is not JSON ({exc})") from None
    if not isinstance(message, dict) or message.get("kind") not in kinds:
        raise RecordError(f"a line of its output is not a {' or '.join(kinds)} message")
    return message


def _int(value: Any, what: str, low: int = 0, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value >= high):
        bound = f"in [{low}, {high})" if high is not None else f">= {low}"
        raise RecordError(f"{what} must be an integer {bound}, got {value!r:.80}")
    return value


def _finite(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RecordError(f"{what} must be a finite number, got {value!r:.80}")
    return float(value)


def _check_message(message: Any, i: int, vocab_size: int | None) -> None:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise RecordError(f"message {i} must be an object with a string role")
    token_ids, logprobs = message.get("token_ids"), message.get("logprobs")
    if token_ids is None:
        return
    if not isinstance(token_ids, list) or not isinstance(logprobs, list) or len(token_ids) != len(logprobs):
        raise RecordError(f"message {i}: token_ids and logprobs must be lists of the same length")
    for t in token_ids:
        _int(t, f"message {i}: a token id", 0, vocab_size)
    for lp in logprobs:
        if _finite(lp, f"message {i}: a logprob") > 0:
            raise RecordError(f"message {i}: a logprob must be <= 0, got {lp!r:.40}")


def check_trajectory(record: Any, *, vocab_size: int | None) -> dict:
    """The record if every field has the type and range the rest of artweb relies on; else RecordError."""
    if not isinstance(record, dict):
        raise RecordError("the trajectory is not an object")
    messages = record.get("messages")
    if not isinstance(messages, list):
        raise RecordError("messages must be a list")
    for i, message in enumerate(messages):
        _check_message(message, i, vocab_size)
    if record.get("reward") is not None:
        _finite(record["reward"], "reward")
    if record.get("error") is not None and not isinstance(record["error"], str):
        raise RecordError("error must be a string or null")
    if record.get("tools") is not None and not isinstance(record["tools"], list):
        raise RecordError("tools must be a list or null")
    for key in ("metrics", "metadata"):
        if not isinstance(record.get(key), dict):
            raise RecordError(f"{key} must be an object")
    logs = record.get("logs")
    if not isinstance(logs, list) or not all(isinstance(line, str) for line in logs):
        raise RecordError("logs must be a list of strings")
    for key in ("duration_ms", "prompt_tokens", "completion_tokens"):
        _int(record.get(key), key)
    if record.get("reward_ms") is not None:
        _int(record["reward_ms"], "reward_ms")
    return _without_nul(record)  # PostgreSQL's text and jsonb refuse NUL characters: the step could not save it


MAX_SCORE_ERROR_CHARS = 20_000


def check_score(record: Any) -> dict:
    """A re-scored trajectory's result ({"reward", "metrics", "error", "reward_ms"}) with the types and
    ranges artweb stores; else RecordError. Only these four keys are kept."""
    if not isinstance(record, dict):
        raise RecordError("the score is not an object")
    reward = record.get("reward")
    if reward is not None:
        reward = _finite(reward, "reward")
    error = record.get("error")
    if error is not None and not isinstance(error, str):
        raise RecordError("error must be a string or null")
    metrics = record.get("metrics")
    if not isinstance(metrics, dict):
        raise RecordError("metrics must be an object")
    reward_ms = record.get("reward_ms")
    if reward_ms is not None:
        _int(reward_ms, "reward_ms")
    if error is not None:
        reward = None  # a failed score has no reward, whatever the record says
    return {
        "reward": reward,
        "metrics": _without_nul(metrics),
        "error": _without_nul(error[:MAX_SCORE_ERROR_CHARS]) if error else error,
        "reward_ms": reward_ms,
    }


def _without_nul(value: Any) -> Any:
    """PostgreSQL stores no NUL character in text or jsonb: drop them rather than lose the score."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_nul(v) for v in value]
    return value
