"""What the guest sends the worker: one JSON line per result on the result pipe, each record shaped, and
bounded in size, here. The worker checks every line again with its own caps (rollouts.sandbox.reader);
this cap only keeps an honest script's oversized record from failing without its logs."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable

from artweb_sdk import Trajectory, TrajectoryGroup

from _artweb_runner.user_code import describe_error

MAX_RECORD_BYTES = 4 << 20  # one trajectory; larger ones are replaced by an error. Set from the batch
# (SandboxLimits.record_bytes): the worker refuses larger records itself, this only keeps their logs.


class ResultPipe:
    """One line per result, then "done", after which nothing. Lines are written one at a time: the report
    before the batch's deadline comes from another thread (last_word)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        self.sent: set[tuple[int, int]] = set()  # (group, index) of every result written

    def send(self, message: dict) -> None:
        if os.getpid() != self._pid:
            # A process forked by the script reached our code: it must not report or run other rollouts.
            os._exit(0)
        data = (json.dumps(message, allow_nan=False) + "\n").encode()
        with self._lock:
            if not self._closed:
                self._write(data, message)

    def last_word(self, unsent: Callable[[set[tuple[int, int]]], list[dict]]) -> None:
        """Write unsent(what was sent) and "done", with no other line between or after them."""
        with self._lock:
            if self._closed:
                return
            for message in unsent(set(self.sent)):
                try:
                    data = (json.dumps(message, allow_nan=False) + "\n").encode()
                except (TypeError, ValueError):
                    data = (json.dumps({**message, "trajectory": None}) + "\n").encode()
                self._write(data, message)
            self._write(b'{"kind": "done"}\n', {"kind": "done"})

    def _write(self, data: bytes, message: dict) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        if message.get("kind") == "done":
            self._closed = True
        elif "group" in message:
            self.sent.add((message["group"], message["index"]))


def score_record(
    reward, metrics: dict, error: str | None, reward_ms: int | None, explanation: str | None = None
) -> dict:
    score = {"reward": reward if error is None else None, "metrics": metrics, "error": error, "reward_ms": reward_ms}
    if explanation:
        score["metrics"] = {**metrics, "ruler_explanation": str(explanation)[:2000]}
    return score


def safe_metrics(trajectory: Trajectory) -> dict:
    try:
        return plain_metrics(trajectory)
    except Exception:
        return {}


def bounded_score(score: dict) -> dict:
    if len(json.dumps(score, default=str)) <= MAX_RECORD_BYTES:
        return score
    return {**score, "metrics": {}, "error": score["error"] and score["error"][:4000]}


def stage_error(stage: str, exc: BaseException, user_files: set[str]) -> str:
    prefix = {"rollout": "", "reward": "The reward function failed: ", "result": "The trajectory is not JSON: "}
    return prefix.get(stage, "") + describe_error(exc, user_files)


def plain_metrics(traj: Trajectory) -> dict:
    return traj.to_record()["metrics"]


def record_of(trajectory: Trajectory | None) -> dict:
    """The trajectory's record. One that cannot be recorded (to_record raised: the rollout's error already
    says why, from its "result" stage) gives an empty record with the trajectory's own log lines, so that only
    its rollout fails, not the sandbox process."""
    if trajectory is None:
        return empty_record()
    try:
        return trajectory.to_record()
    except Exception:
        try:
            logs = [str(line) for line in trajectory.logs]
        except Exception:
            logs = []
        return {**empty_record(), "logs": logs}


def empty_record() -> dict:
    return {"messages": [], "tools": None, "reward": None, "metrics": {}, "metadata": {}, "logs": []}


def bounded_record(record: dict) -> dict:
    size = len(json.dumps(record, default=str))
    if size <= MAX_RECORD_BYTES:
        return record
    return {
        **empty_record(),
        "logs": record["logs"][-50:],
        "error": f"The trajectory is {size / (1 << 20):.1f} MB as JSON; the limit is {MAX_RECORD_BYTES / (1 << 20):.1f} MB.",
        "duration_ms": record["duration_ms"],
        "prompt_tokens": record["prompt_tokens"],
        "completion_tokens": record["completion_tokens"],
    }


# How the trajectories of a rollout that returned several are grouped for GRPO (rollouts.sandbox.records
# .scored_groups): a list or tuple is one trajectory per role, and the k-th trajectories of a scenario's
# rollouts form its k-th group (ART's self-play examples); a TrajectoryGroup is one game, a group of its own.
BY_POSITION, ONE_GROUP = "by_position", "one_group"


async def returned_trajectories(value) -> tuple[list[Trajectory], str]:
    """What rollout() returned, as (its trajectories, how they are grouped); TypeError or ValueError, saying
    what to return, for anything else."""
    if isinstance(value, Trajectory):
        return [value], BY_POSITION
    if isinstance(value, TrajectoryGroup):
        group = await value  # a group built from awaitables runs them; those that raised stay in exceptions
        if not group.trajectories and group.exceptions:
            raise group.exceptions[0]
        items, grouping = list(group.trajectories), ONE_GROUP
    elif isinstance(value, (list, tuple)):
        items, grouping = list(value), BY_POSITION
    else:
        raise TypeError(
            "rollout() must return an art.Trajectory, a list of them (one per role: self-play), or an "
            f"art.TrajectoryGroup (one game), not {type(value).__name__}"
        )
    for item in items:
        if not isinstance(item, Trajectory):
            raise TypeError(f"rollout() returned {type(item).__name__} among its trajectories, not an art.Trajectory")
    if not items:
        raise ValueError("rollout() returned no trajectories; return at least one art.Trajectory")
    return items, grouping


def rollout_record(trajectories: list[Trajectory], grouping: str) -> dict:
    """The record of a rollout: its first trajectory's, and when it returned several (or a group), the
    others' in "more_trajectories" with the "grouping" they train in."""
    record = record_of(trajectories[0] if trajectories else None)
    if len(trajectories) > 1 or grouping != BY_POSITION:
        record["more_trajectories"] = [record_of(t) for t in trajectories[1:]]
        record["grouping"] = grouping
    return record


def settle_others(record: dict) -> None:
    """The rollout's other trajectories take its outcome: none when it failed (only its first is kept, to
    inspect), else its duration. What it cost in tokens is counted once, on its first trajectory."""
    if record["error"] is not None:
        record.pop("more_trajectories", None)
        record.pop("grouping", None)
        return
    for other in record.get("more_trajectories", ()):
        other.update(error=None, duration_ms=record["duration_ms"], prompt_tokens=0, completion_tokens=0)
