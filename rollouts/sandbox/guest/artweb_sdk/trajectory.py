"""Trajectories and groups, shaped like ART's so scripts written for ART run unchanged.

A trajectory's `messages_and_choices` mixes plain message dicts (prompts, tool results, anything the
script wrote) with the OpenAI `Choice` objects the policy returned. Only the choices are the policy's
own samples: they carry the sampled token ids and logprobs the trainer needs, so `to_record` keeps them
next to the message they produced.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any


class History:
    """A conversation of a rollout beside its main one (ART's `Trajectory.additional_histories`): its own
    messages and choices, and the tools it offered. As in ART, it is trained as a sequence of its own
    that carries its trajectory's reward (and so its advantage)."""

    def __init__(self, messages_and_choices: list | None = None, tools: list | None = None) -> None:
        self.messages_and_choices = list(messages_and_choices or [])
        self.tools = tools

    def __repr__(self) -> str:
        return f"History(messages={len(self.messages_and_choices)})"

    def messages(self) -> list[dict]:
        return [message_dict(item) for item in self.messages_and_choices]

    def to_record(self) -> dict:
        """{"messages", "tools"}: its messages as a trajectory record holds them (sampled choices with their
        token ids and logprobs), the shape of each of a record's `additional_histories`."""
        return {"messages": [message_record(item) for item in self.messages_and_choices], "tools": _plain(self.tools)}


def _history(value: Any) -> History:
    if isinstance(value, History):
        return value
    if isinstance(value, dict):
        return History(value.get("messages_and_choices"), value.get("tools"))
    raise TypeError(f"additional_histories holds art History objects or dicts, not {type(value).__name__}")


class Trajectory:
    """One rollout: what was said, the policy's sampled choices, and its reward."""

    def __init__(
        self,
        messages_and_choices: list | None = None,
        tools: list | None = None,
        reward: float | None = None,
        metrics: dict | None = None,
        metadata: dict | None = None,
        logs: list[str] | None = None,
        additional_histories: list | None = None,
        initial_policy_version: int | None = None,
        final_policy_version: int | None = None,
        start_time: datetime | None = None,
        **extra: Any,
    ) -> None:
        self.messages_and_choices = list(messages_and_choices or [])
        self.tools = tools
        self.reward = reward
        self.metrics = dict(metrics or {})
        self.metadata = dict(metadata or {})
        self.logs = list(logs or [])
        # Recorded and trained with the trajectory, each as a sequence of its own (to_record).
        self.additional_histories = [_history(h) for h in additional_histories or []]
        self.initial_policy_version = initial_policy_version
        self.final_policy_version = final_policy_version
        self.start_time = start_time or datetime.now()
        # Other keyword arguments (fields of ART versions artweb does not know) are kept, not rejected.
        self.extra = extra

    def __repr__(self) -> str:
        return f"Trajectory(messages={len(self.messages_and_choices)}, reward={self.reward!r})"

    def log(self, message: str) -> None:
        self.logs.append(str(message))

    def finish(self) -> Trajectory:
        """Sets metrics["duration"], the seconds since the trajectory was created, as ART does."""
        self.metrics["duration"] = (datetime.now() - self.start_time).total_seconds()
        return self

    @contextlib.asynccontextmanager
    async def track_duration(self, metric_name: str):
        """`async with trajectory.track_duration("tool"):` adds the block's seconds to
        metrics["tool_duration"] (summed over every block of that name)."""
        started = time.monotonic()
        try:
            yield
        finally:
            key = f"{metric_name}_duration"
            self.metrics[key] = self.metrics.get(key, 0.0) + (time.monotonic() - started)

    def messages(self) -> list[dict]:
        """The conversation as plain OpenAI message dicts (choices turned into assistant messages)."""
        return [message_dict(item) for item in self.messages_and_choices]

    def for_logging(self) -> dict:
        """ART's printable view: the fields, and each message marked trainable when the policy sampled it."""
        return {
            "reward": self.reward,
            "initial_policy_version": self.initial_policy_version,
            "final_policy_version": self.final_policy_version,
            "metrics": self.metrics,
            "metadata": self.metadata,
            "messages": [{**message_dict(m), "trainable": _is_choice(m)} for m in self.messages_and_choices],
            "tools": self.tools,
            "logs": self.logs,
        }

    def to_record(self) -> dict:
        """The JSON shape artweb stores and trains on (see rollouts.sandbox.rollouts); the worker checks it
        again, its additional histories included (rollouts.sandbox.records.check_trajectory)."""
        record = {
            "messages": [message_record(item) for item in self.messages_and_choices],
            "tools": _plain(self.tools),
            "reward": self.reward,
            "metrics": _plain(self.metrics),
            "metadata": _plain(self.metadata),
            "logs": [str(line) for line in self.logs],
        }
        if self.additional_histories:
            record["additional_histories"] = [_history(h).to_record() for h in self.additional_histories]
        return record


class TrajectoryGroup:
    """The rollouts of one scenario, compared with each other by GRPO.

    Built from trajectories, exceptions (kept in `exceptions`) or awaitables of trajectories; awaiting
    the group runs the awaitables concurrently and keeps the ones that raised in `exceptions`, as ART
    does. `metadata`, `metrics` and `logs` are the group's own, as in ART; artweb keeps them on the group.
    """

    def __init__(
        self,
        trajectories: Iterable = (),
        exceptions: list[BaseException] | None = None,
        *,
        metadata: dict | None = None,
        metrics: dict | None = None,
        logs: list[str] | None = None,
    ) -> None:
        items = list(trajectories)
        for item in items:
            if not isinstance(item, (Trajectory, BaseException)) and not inspect.isawaitable(item):
                raise TypeError(
                    "a TrajectoryGroup holds art.Trajectory objects, exceptions or awaitables of trajectories, "
                    f"not {type(item).__name__}"
                )
        self._pending = [t for t in items if inspect.isawaitable(t)]
        self.trajectories: list[Trajectory] = [t for t in items if isinstance(t, Trajectory)]
        self.exceptions: list[BaseException] = [t for t in items if isinstance(t, BaseException)]
        self.exceptions += list(exceptions or [])
        self.metadata = dict(metadata or {})
        self.metrics = dict(metrics or {})
        self.logs = list(logs or [])

    def __iter__(self):
        return iter(self.trajectories)

    def __len__(self) -> int:
        return len(self.trajectories)

    def __getitem__(self, index):
        return self.trajectories[index]

    def __repr__(self) -> str:
        return f"TrajectoryGroup(trajectories={len(self.trajectories)}, exceptions={len(self.exceptions)})"

    def __await__(self):
        return self._gather().__await__()

    def log(self, message: str) -> None:
        self.logs.append(str(message))

    @property
    def size(self) -> int:
        """Its rollouts, finished or not: what a share of `max_exceptions` is counted against."""
        return len(self._pending) + len(self.trajectories)

    async def _gather(self) -> TrajectoryGroup:
        pending, self._pending = self._pending, []
        for outcome in await asyncio.gather(*pending, return_exceptions=True):
            if isinstance(outcome, BaseException):
                if isinstance(outcome, (KeyboardInterrupt, SystemExit)):
                    raise outcome
                self.exceptions.append(outcome)
            elif isinstance(outcome, Trajectory):
                self.trajectories.append(outcome)
            else:
                self.exceptions.append(
                    TypeError(f"a rollout of this group returned {type(outcome).__name__}, not an art.Trajectory")
                )
        return self


def check_reward(value: Any) -> float | None:
    """A reward must be a finite number or None; say clearly what was returned otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        # numpy scalars and similar: accept anything float() takes exactly.
        if hasattr(value, "__float__") and not isinstance(value, (str, bytes, bool)):
            value = float(value)
        else:
            raise TypeError(f"a reward must be a finite number or None, got {type(value).__name__}: {value!r:.200}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"a reward must be a finite number or None, got {value}")
    return value


# --- turning messages and choices into plain JSON --------------------------------------------------


def _is_choice(item: Any) -> bool:
    # An OpenAI Choice (or anything shaped like one): a message plus a finish_reason.
    return hasattr(item, "message") and hasattr(item, "finish_reason") and not isinstance(item, dict)


def message_dict(item: Any) -> dict:
    """An OpenAI message dict for a dict, a pydantic message, or a Choice."""
    if _is_choice(item):
        item = item.message
    if hasattr(item, "model_dump"):
        item = item.model_dump(exclude_none=True)
    if not isinstance(item, dict):
        raise TypeError(
            f"messages_and_choices may hold message dicts and OpenAI Choice objects, not {type(item).__name__}"
        )
    message = {"role": item.get("role", "assistant"), "content": _content(item.get("content"))}
    if item.get("tool_calls"):
        message["tool_calls"] = [_tool_call(call) for call in item["tool_calls"]]
    for key in ("tool_call_id", "name"):
        if item.get(key) is not None:
            message[key] = str(item[key])
    return message


def message_record(item: Any) -> dict:
    """message_dict, plus the sampled token ids, logprobs and finish reason when item is a Choice."""
    message = message_dict(item)
    if not _is_choice(item):
        return message
    token_ids = _extra(item, "token_ids")
    logprobs = [entry.logprob for entry in (item.logprobs.content or [])] if item.logprobs else []
    message["token_ids"] = [int(t) for t in token_ids or []]
    message["logprobs"] = [float(lp) if math.isfinite(lp) else -1e9 for lp in logprobs]
    message["finish_reason"] = item.finish_reason
    return message


def _extra(obj: Any, key: str) -> Any:
    value = getattr(obj, key, None)
    if value is None and getattr(obj, "model_extra", None):
        value = obj.model_extra.get(key)
    return value


def _content(content: Any) -> Any:
    if content is None or isinstance(content, str):
        return content if content is not None else ""
    return _plain(content)  # a list of content parts stays a list


def _tool_call(call: Any) -> dict:
    if hasattr(call, "model_dump"):
        call = call.model_dump(exclude_none=True)
    fn = call.get("function") or {}
    arguments = fn.get("arguments", "")
    return {
        "id": call.get("id", ""),
        "type": call.get("type", "function"),
        "function": {
            "name": fn.get("name", ""),
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }


def _plain(value: Any) -> Any:
    """A JSON-safe copy: pydantic models dumped, unknown objects as their repr."""
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    if hasattr(value, "model_dump"):
        return _plain(value.model_dump(exclude_none=True))
    if hasattr(value, "__float__"):
        return _plain(float(value))
    return repr(value)
