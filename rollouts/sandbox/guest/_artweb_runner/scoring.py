"""Score mode: stored trajectories rebuilt as the reward function saw them in the step, and scored again
by it or by the RULER judge; no rollout script, no policy."""

from __future__ import annotations

import asyncio
import copy
import time
import types
from pathlib import Path

from artweb_sdk import History, Scenario, Trajectory, TrajectoryGroup
from artweb_sdk.trajectory import check_reward

from _artweb_runner.batch import Batch, RolloutTimeout
from _artweb_runner.results import bounded_score, safe_metrics, score_record, stage_error
from _artweb_runner.user_code import RolloutLog, call_maybe_async, current_log, describe_error


class StoredMessage:
    """An assistant message the policy sampled, shaped like the OpenAI client's ChatCompletionMessage:
    attributes, and model_dump() for the SDK. Built here rather than with the client library, whose import
    alone costs a sandbox about a CPU-second."""

    def __init__(self, message: dict) -> None:
        self._dict = {"role": "assistant", "content": message.get("content"), "tool_calls": message.get("tool_calls")}
        self.role, self.content, self.refusal = "assistant", message.get("content"), None
        self.tool_calls = [
            types.SimpleNamespace(
                id=call.get("id", ""),
                type=call.get("type", "function"),
                function=types.SimpleNamespace(**{"name": "", "arguments": "", **(call.get("function") or {})}),
            )
            for call in message.get("tool_calls") or []
        ] or None

    def model_dump(self, exclude_none: bool = False, **_kwargs) -> dict:
        return {k: copy.deepcopy(v) for k, v in self._dict.items() if not (exclude_none and v is None)}


class StoredChoice:
    """A sampled completion choice as the script got it in the step: message, finish_reason, logprobs and
    the sampled token ids."""

    def __init__(self, message: dict) -> None:
        self.index = 0
        self.finish_reason = message.get("finish_reason")
        self.message = StoredMessage(message)
        self.token_ids = list(message.get("token_ids") or [])
        self.logprobs = types.SimpleNamespace(
            content=[
                types.SimpleNamespace(token="", logprob=lp, bytes=None, top_logprobs=[])
                for lp in message.get("logprobs") or []
            ]
        )

    def __repr__(self) -> str:
        return f"Choice(finish_reason={self.finish_reason!r}, message={self.message.model_dump(exclude_none=True)!r})"


def restore_item(message: dict):
    """A stored message as the reward function saw it in the step: an assistant message the policy sampled
    (stored with its finish_reason) becomes a choice again, token ids and logprobs included; anything else
    stays a plain message dict."""
    if isinstance(message, dict) and "finish_reason" in message:
        return StoredChoice(message)
    return message


def restore_trajectory(record: dict) -> Trajectory:
    return Trajectory(
        messages_and_choices=[restore_item(m) for m in record.get("messages") or []],
        tools=record.get("tools"),
        metrics=record.get("metrics") or {},
        metadata=record.get("metadata") or {},
        additional_histories=[
            History([restore_item(m) for m in h.get("messages") or []], h.get("tools"))
            for h in record.get("additional_histories") or []
        ],
    )


class ScoreBatch(Batch):
    """Score mode: no rollout script and no policy. Each group's stored trajectories are rebuilt as the
    reward function saw them in the step and scored by it (or by the RULER judge); one "score" line per
    trajectory: {"reward", "metrics", "error", "reward_ms"}."""

    def load(self, workdir: Path) -> None:
        if not self.reward_kind:
            return
        try:
            self.load_reward(workdir)
        except BaseException as exc:
            self.load_error = "Loading your code failed: " + describe_error(exc, self.user_files)

    async def run_group(self, group: dict) -> None:
        trajectories = [restore_trajectory(r) for r in group["trajectories"]]
        if self.load_error is not None:
            scores = [score_record(None, {}, self.load_error, None) for _ in trajectories]
        elif self.ruler:
            scores = await self.ruler_scores(group, trajectories)
        elif self.reward_kind == "group":
            scores = await self.group_scores(group, trajectories)
        else:
            scores = await asyncio.gather(*(self.score_one(group, t) for t in trajectories))
        for index, score in enumerate(scores):
            self.pipe.send({"kind": "score", "group": group["index"], "index": index, "score": bounded_score(score)})

    async def score_one(self, group: dict, trajectory: Trajectory) -> dict:
        async with self.semaphore:
            log = RolloutLog()
            current_log.set(log)
            task = asyncio.current_task()
            self.watchdog.deadlines[task] = time.monotonic() + self.timeout_s
            scenario = Scenario(copy.deepcopy(group["scenario"]))
            started = time.monotonic()
            reward, error = None, None
            try:
                async with asyncio.timeout(self.timeout_s) as deadline:
                    reward = check_reward(await call_maybe_async(self.reward, trajectory, scenario))
                    trajectory.to_record()
            except RolloutTimeout:
                error = f"Timed out: the reward did not finish within {self.timeout_s:g} s (wall clock)."
            except TimeoutError as exc:
                error = (
                    f"Timed out: the reward did not finish within {self.timeout_s:g} s (wall clock)."
                    if deadline.expired()
                    else stage_error("reward", exc, self.user_files)
                )
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    raise
                error = stage_error("reward", exc, self.user_files)
            finally:
                self.watchdog.deadlines.pop(task, None)
            reward_ms = int((time.monotonic() - started) * 1000)
            return score_record(reward, safe_metrics(trajectory), error, reward_ms)

    async def group_scores(self, group: dict, trajectories: list[Trajectory]) -> list[dict]:
        scenario = Scenario(copy.deepcopy(group["scenario"]))
        error, rewards = None, []
        started = time.monotonic()
        task = asyncio.current_task()
        self.watchdog.deadlines[task] = started + self.timeout_s
        try:
            async with asyncio.timeout(self.timeout_s):
                rewards = list(await call_maybe_async(self.reward, TrajectoryGroup(trajectories), scenario))
            if len(rewards) != len(trajectories):
                raise ValueError(f"score_group returned {len(rewards)} rewards for {len(trajectories)} trajectories")
            rewards = [check_reward(r) for r in rewards]
        except (TimeoutError, RolloutTimeout):
            error = f"Timed out: score_group did not finish within {self.timeout_s:g} s (wall clock)."
        except Exception as exc:
            error = stage_error("reward", exc, self.user_files)
        finally:
            self.watchdog.deadlines.pop(task, None)
        share_ms = int((time.monotonic() - started) * 1000 / max(1, len(trajectories)))
        return [
            score_record(rewards[i] if error is None else None, safe_metrics(t), error, share_ms)
            for i, t in enumerate(trajectories)
        ]

    async def ruler_scores(self, group: dict, trajectories: list[Trajectory]) -> list[dict]:
        scores, error, judge_ms = await self.judge(group, trajectories)
        if error is not None:
            return [score_record(None, {}, error, judge_ms) for _ in trajectories]
        return [
            score_record(s.score, {"ruler_score": s.score}, None, judge_ms, explanation=s.explanation) for s in scores
        ]
