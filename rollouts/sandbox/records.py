"""What a sandbox sends back, checked before anything is stored or trained on.

The guest program runs in the same process as the user's code, so everything it writes is the user's
word: a record may claim any group, any reward, any token id, and the guest's own caps are the user's to
bypass (the script can write to the result pipe itself, or change the guest's limits). So the worker
enforces every cap again, with the numbers of rollouts.sandbox.batch.SandboxLimits:

- a line's nesting depth is bounded before it is parsed (the parser recurses once per level);
- a line longer than twice the record limit is not read further (line_limit);
- each record (a trajectory or a score) is held to the record limit by the length of its line, which is
  the record as the guest wrote it and measured it (record_size) plus a few bytes around it, and the
  batch's records together to the batch limit (ResultBudget);
- the number of records is bounded by the protocol: one per rollout slot the sandbox owns, each once,
  then one "done" line, after which nothing.

Each line is parsed without NaN or Infinity and checked field by field here; a record that fails becomes
that rollout's error.
"""

from __future__ import annotations

import json
import math
from typing import Any

from rollouts.sandbox.jsonsafe import JSONLimitError, loads_bounded


class RecordError(ValueError):
    """A record from a sandbox breaks the protocol; the message says how."""


def _no_constants(name: str):
    raise RecordError(f"the record holds {name}, which JSON does not allow")


def parse_line(line: bytes, kinds: tuple[str, ...], *, max_depth: int) -> dict:
    """One protocol line → a message dict ({"kind": one of kinds, ...}); a re-scoring batch sends "score"
    and "done" lines instead of trajectories. A line nested deeper than max_depth is refused unparsed."""
    try:
        message = loads_bounded(line, max_depth=max_depth, parse_constant=_no_constants)
    except RecordError:
        raise
    except JSONLimitError:
        raise RecordError(
            f"a line of its output is nested more than {max_depth} levels deep, the limit "
            "(SandboxLimits.record_depth); keep metadata and metrics flatter"
        ) from None
    except ValueError as exc:
        raise RecordError(f"a line of its output is not JSON ({exc})") from None
    if not isinstance(message, dict) or message.get("kind") not in kinds:
        raise RecordError(f"a line of its output is not a {' or '.join(kinds)} message")
    return message


# A result line is {"kind": ..., "group": ..., "index": ..., "trajectory" or "score": <record>}: these bytes
# cover what surrounds the record, which the guest's cap (on the record alone) leaves out.
RECORD_ENVELOPE_BYTES = 1024


def line_limit(record_bytes: int) -> int:
    """The longest line the worker reads: twice the record limit, so that a record over the limit (which
    no guest sends: it replaces those) is still read whole and fails its own rollout only. Past it, the
    worker cannot tell whose record it is and stops reading the sandbox."""
    return 2 * record_bytes


def record_size(value: Any) -> int:
    """Bytes of a record as JSON, measured as the guest measures it against its cap (ASCII-escaped JSON:
    one byte a character): what a stored trajectory counts against its owner's quota."""
    return len(json.dumps(value))


def megabytes(n: int) -> str:
    return f"{n / (1 << 20):.1f} MB"


class ResultBudget:
    """The bytes a batch's records may take together (SandboxLimits.batch_bytes), shared by its sandbox
    processes: each record kept takes its size, and one that no longer fits fails its own rollout."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        return True


def _int(value: Any, what: str, low: int = 0, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value >= high):
        bound = f"in [{low}, {high})" if high is not None else f">= {low}"
        raise RecordError(f"{what} must be an integer {bound}, got {value!r:.80}")
    return value


def _finite(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RecordError(f"{what} must be a finite number, got {value!r:.80}")
    return float(value)


def _check_message(message: Any, i: int, vocab_size: int | None, where: str = "") -> None:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise RecordError(f"{where}message {i} must be an object with a string role")
    token_ids, logprobs = message.get("token_ids"), message.get("logprobs")
    if token_ids is None:
        return
    if not isinstance(token_ids, list) or not isinstance(logprobs, list) or len(token_ids) != len(logprobs):
        raise RecordError(f"{where}message {i}: token_ids and logprobs must be lists of the same length")
    for t in token_ids:
        _int(t, f"{where}message {i}: a token id", 0, vocab_size)
    for lp in logprobs:
        if _finite(lp, f"{where}message {i}: a logprob") > 0:
            raise RecordError(f"{where}message {i}: a logprob must be <= 0, got {lp!r:.40}")


# A trajectory's additional histories (ART's: conversations beside its main one, each trained as a sequence
# of its own with the trajectory's advantage), and the trajectories one rollout may return (self-play: one per
# role). Both are bounded by the record's bytes too; these caps keep each count sane on its own.
MAX_ADDITIONAL_HISTORIES = 128
MAX_TRAJECTORIES_PER_ROLLOUT = 32
# How a rollout's several trajectories train (scored_groups): "by_position", the k-th trajectories of a
# scenario's rollouts form one group; "one_group", the rollout's trajectories are a group of their own.
GROUPINGS = ("by_position", "one_group")


def _check_messages(messages: Any, vocab_size: int | None, where: str = "") -> None:
    if not isinstance(messages, list):
        raise RecordError(f"{where}messages must be a list")
    for i, message in enumerate(messages):
        _check_message(message, i, vocab_size, where)


def _check_histories(histories: Any, vocab_size: int | None) -> None:
    """additional_histories: absent, or a list of {"messages": [...], "tools": list | null}."""
    if histories is None:
        return
    if not isinstance(histories, list):
        raise RecordError('additional_histories must be a list of {"messages", "tools"} objects')
    if len(histories) > MAX_ADDITIONAL_HISTORIES:
        raise RecordError(
            f"the trajectory has {len(histories)} additional_histories; at most {MAX_ADDITIONAL_HISTORIES} are "
            "kept (MAX_ADDITIONAL_HISTORIES): put fewer conversations in one trajectory"
        )
    for h, history in enumerate(histories):
        where = f"additional history {h}: "
        if not isinstance(history, dict) or set(history) - {"messages", "tools"}:
            raise RecordError(f'{where}must be an object with only "messages" and "tools"')
        _check_messages(history.get("messages"), vocab_size, where)
        if history.get("tools") is not None and not isinstance(history["tools"], list):
            raise RecordError(f"{where}tools must be a list or null")


def _check_others(record: dict, vocab_size: int | None) -> None:
    """more_trajectories and grouping: the other trajectories of a rollout that returned several, each a
    whole record of its own (without others of its own)."""
    others, grouping = record.get("more_trajectories"), record.get("grouping")
    if others is None and grouping is None:
        return
    if not isinstance(others, list) or grouping not in GROUPINGS:
        raise RecordError(f"more_trajectories must be a list, with a grouping of {' or '.join(GROUPINGS)}")
    if len(others) + 1 > MAX_TRAJECTORIES_PER_ROLLOUT:
        raise RecordError(
            f"the rollout returned {len(others) + 1} trajectories; at most {MAX_TRAJECTORIES_PER_ROLLOUT} are "
            "kept from one rollout (MAX_TRAJECTORIES_PER_ROLLOUT)"
        )
    for k, other in enumerate(others, start=1):
        if not isinstance(other, dict) or "more_trajectories" in other or "grouping" in other:
            raise RecordError(f"trajectory {k} of the rollout must be a trajectory object without others of its own")
        try:
            check_trajectory(other, vocab_size=vocab_size)
        except RecordError as exc:
            raise RecordError(f"trajectory {k} of the rollout: {exc}") from None
        if other.get("error") is not None:
            raise RecordError(f"trajectory {k} of the rollout has an error of its own; a rollout fails as a whole")


def check_trajectory(record: Any, *, vocab_size: int | None) -> dict:
    """The record if every field has the type and range the rest of artweb relies on; else RecordError."""
    if not isinstance(record, dict):
        raise RecordError("the trajectory is not an object")
    _check_messages(record.get("messages"), vocab_size)
    _check_histories(record.get("additional_histories"), vocab_size)
    _check_others(record, vocab_size)
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


def scored_groups(trajectories: list[dict]) -> list[list[dict]]:
    """The GRPO groups of one scenario's rollouts, in a fixed order (the trainer and the stored groups
    both split them so; advantages are matched by it).

    A rollout that returned one trajectory puts it in the scenario's first group, as ever. One that returned
    a list (grouping "by_position", one trajectory per role) puts its k-th trajectory in the scenario's k-th
    group, as ART's self-play examples group them by role; one that returned a TrajectoryGroup ("one_group")
    is a group of its own, as gather_trajectory_groups trains a group a coroutine returns. A failed rollout
    keeps only its first record (to inspect), in the first group."""
    groups: dict[tuple[str, int], list[dict]] = {("position", 0): []}
    for i, record in enumerate(trajectories):
        members = [{k: v for k, v in record.items() if k not in ("more_trajectories", "grouping")}]
        if record.get("error") is None:
            members += record.get("more_trajectories") or []
        own = record.get("grouping") == "one_group" and record.get("error") is None
        for k, member in enumerate(members):
            groups.setdefault(("rollout", i) if own else ("position", k), []).append(member)
    return [group for key, group in groups.items() if group or len(groups) == 1]


# What a sandbox may say of a rollout it could not finish before the batch's deadline: an "unfinished" line,
# its last word on that rollout (rollouts.sandbox.process asks for it just before the deadline), with the
# rollout's trajectory when it had one (checked as any other). Only the tail of its log is kept, bounded
# here whatever the line held.
UNFINISHED_STATES = ("waiting", "running", "scoring")  # not started / in rollout() or its reward / its group's
REPORT_LOG_LINES = 20
REPORT_LINE_CHARS = 1000


def check_unfinished(message: Any) -> dict:
    """An "unfinished" line's report: {"state": one of UNFINISHED_STATES, "seconds": float | None (how long
    it had run), "logs": the last REPORT_LOG_LINES lines it printed, each cut to REPORT_LINE_CHARS}."""
    state = message.get("state")
    if state not in UNFINISHED_STATES:
        raise RecordError(f"an unfinished rollout's state must be one of {', '.join(UNFINISHED_STATES)}")
    seconds = message.get("seconds")
    if seconds is not None and _finite(seconds, "seconds") < 0:
        raise RecordError("an unfinished rollout's seconds must be >= 0")
    logs = message.get("logs", [])
    if not isinstance(logs, list) or not all(isinstance(line, str) for line in logs):
        raise RecordError("an unfinished rollout's logs must be a list of strings")
    return {
        "state": state,
        "seconds": None if seconds is None else float(seconds),
        "logs": [_without_nul(line[:REPORT_LINE_CHARS]) for line in logs[-REPORT_LOG_LINES:]],
    }


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


# How the guest words a reward function's failure (_artweb_runner.results.stage_error and the timeouts of
# _artweb_runner.batch), as opposed to the rollout's own: the pages that count reward errors tell them apart.
REWARD_ERROR_PREFIX = "The reward function failed: "
REWARD_TIMEOUT_PREFIXES = ("Timed out: the reward did not finish", "Timed out: score_group did not finish")


def reward_failed(error: str | None) -> bool:
    """The reward function failed on this trajectory (it raised, gave no finite number, or timed out),
    not the rollout before it."""
    return bool(error) and error.startswith((REWARD_ERROR_PREFIX, *REWARD_TIMEOUT_PREFIXES))


# How a rollout stopped at its batch's deadline is told (rollouts.sandbox.rollouts.deadline_error): its error
# starts with this and names every rollout the batch stopped, so the first such error says which hung.
DEADLINE_PREFIX = "The batch did not finish within its "


def deadline_stopped(error: str | None) -> bool:
    """The rollout was still unfinished when its batch reached its deadline, and was stopped."""
    return bool(error) and error.startswith(DEADLINE_PREFIX)


def deadline_summary(error: str) -> str:
    """The first paragraph of such an error: the limit and the rollouts it stopped, the same in each of them."""
    return error.split("\n\n", 1)[0]
