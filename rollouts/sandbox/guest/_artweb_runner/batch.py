"""A batch of rollouts in the guest: every rollout of its groups concurrently on one asyncio loop, each under
its wall-clock limit, then scored by the reward function (per trajectory or per group) or by RULER.

Timeouts: `asyncio.timeout` stops a rollout that waits too long; a rollout that blocks the loop
itself (`while True: pass`) is interrupted by a watchdog thread, which signals the main thread so
that a RolloutTimeout is raised inside the blocking code, failing that rollout and no other.

A rollout that outlives both (it swallows its timeout, or blocks where no signal reaches it) holds the
batch until the worker's deadline. Shortly before it, the worker asks for a report on the control pipe: a
thread here then answers for every rollout not yet sent (Batch.report) and the process ends, so the
worker keeps what finished and learns where each of the others was and what it printed last.
"""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import threading
import time
from pathlib import Path

from artweb_sdk import Scenario, TrainableModel, Trajectory, TrajectoryGroup
from artweb_sdk.model import Endpoint, Usage, current_usage
from artweb_sdk.ruler import RulerError, TrajectoryScore, apply_score, judge_client, score_message_lists
from artweb_sdk.trajectory import check_reward

from _artweb_runner.results import (
    BY_POSITION,
    ResultPipe,
    bounded_record,
    plain_metrics,
    returned_trajectories,
    rollout_record,
    settle_others,
    stage_error,
)
from _artweb_runner.user_code import (
    RolloutLog,
    bundle_import_path,
    call_maybe_async,
    current_log,
    describe_error,
    load_module,
)


class RolloutTimeout(BaseException):
    """Raised inside a rollout that overran its wall-clock limit.

    A BaseException, so a script's `except Exception:` cannot swallow it and keep going.
    """


class Watchdog(threading.Thread):
    """Interrupts a rollout that keeps the event loop blocked past its deadline."""

    def __init__(self, loop: asyncio.AbstractEventLoop, grace_s: float = 1.0) -> None:
        super().__init__(name="artweb-watchdog", daemon=True)
        self.loop = loop
        self.grace_s = grace_s
        self.deadlines: dict[asyncio.Task, float] = {}
        self.target: asyncio.Task | None = None
        self._main = threading.main_thread().ident

    def run(self) -> None:
        while True:
            time.sleep(0.2)
            task = asyncio.current_task(self.loop) if self.loop.is_running() else None
            deadline = self.deadlines.get(task) if task is not None else None
            if deadline is not None and time.monotonic() > deadline + self.grace_s:
                self.target = task
                signal.pthread_kill(self._main, signal.SIGUSR1)
                time.sleep(self.grace_s)

    def on_signal(self, _signum, _frame) -> None:
        task = asyncio.current_task(self.loop) if self.loop.is_running() else None
        if task is not None and task is self.target:
            self.target = None
            raise RolloutTimeout()


class Slot:
    """Where one rollout is, for the report before the deadline: "waiting" for the concurrency limit,
    "running" (its log and start time set), or "finished" (its record set, its group's scoring pending)."""

    def __init__(self) -> None:
        self.state = "waiting"
        self.log: RolloutLog | None = None
        self.started = 0.0
        self.record: dict | None = None


REPORT_LOG_LINES = 20  # of a rollout's log, the last lines the report carries (the worker keeps as many)


class Batch:
    def __init__(self, spec: dict, pipe: ResultPipe) -> None:
        self.spec = spec
        self.pipe = pipe
        self.timeout_s = float(spec["rollout_timeout_s"])
        endpoint = Endpoint.from_env()
        endpoint.max_connections = max(1, int(spec["concurrency"]))
        self.model = TrainableModel(name=spec["model_name"], project="artweb", _endpoint=endpoint)
        self.semaphore = asyncio.Semaphore(max(1, int(spec["concurrency"])))
        self.user_files = {"rollout.py", "reward.py"}
        self.rollout = None
        self.reward = None
        self.reward_kind = spec.get("reward_kind")
        # RULER: after a group's rollouts (and its reward function), the judge's scores become the rewards.
        self.ruler = bool(spec.get("ruler"))
        self.judge_model = spec.get("judge_model")
        self.load_error: str | None = None
        self.watchdog: Watchdog | None = None
        # Every rollout's slot from the start: the reporting thread reads this dict, which never changes size.
        # (A score batch has no rollouts: no group_size.)
        size = int(spec.get("group_size", 0))
        self.slots = {(g["index"], i): Slot() for g in spec["groups"] for i in range(size)}

    def load(self, workdir: Path) -> None:
        try:
            self.user_files |= bundle_import_path(workdir)
            script = load_module(workdir / "rollout.py", "rollout_script")
            self.rollout = getattr(script, "rollout", None)
            if not callable(self.rollout):
                raise AttributeError("the rollout script defines no function named `rollout(model, scenario)`")
            if self.reward_kind:
                self.load_reward(workdir)
        except BaseException as exc:
            self.load_error = "Loading your code failed: " + describe_error(exc, self.user_files)

    def load_reward(self, workdir: Path) -> None:
        """The reward function file's `reward` (per trajectory) or `score_group` (per group)."""
        module = load_module(workdir / "reward.py", "reward_function")
        name = "score_group" if self.reward_kind == "group" else "reward"
        self.reward = getattr(module, name, None)
        if not callable(self.reward):
            raise AttributeError(f"the reward function file defines no function named `{name}`")

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.watchdog = Watchdog(loop)
        signal.signal(signal.SIGUSR1, self.watchdog.on_signal)
        self.watchdog.start()
        await asyncio.gather(*(self.run_group(g) for g in self.spec["groups"]))

    async def run_group(self, group: dict) -> None:
        records = await asyncio.gather(*(self.run_one(group, i) for i in range(int(self.spec["group_size"]))))
        if self.reward_kind == "group" and self.load_error is None:
            await self.score_group(group, records)
        if self.ruler and self.load_error is None:
            await self.ruler_group(group, records)
        for index, (record, _) in enumerate(records):
            self.pipe.send({"kind": "trajectory", "group": group["index"], "index": index, "trajectory": record})

    def watch_deadline(self, control_fd: int, *, asked: bool = False) -> None:
        """Report (and end the process) when the worker asks, by a line on the control pipe, from a thread of
        its own: the main thread may be the one a rollout keeps busy. A pipe closed without one asks nothing."""

        def wait() -> None:
            try:
                request = asked or os.read(control_fd, 4096)
            except OSError:
                request = b""
            if request:
                self.pipe.last_word(self.report)
                os._exit(0)

        threading.Thread(target=wait, name="artweb-deadline", daemon=True).start()

    def report(self, sent: set[tuple[int, int]]) -> list[dict]:
        """A line for every rollout not in `sent`: a finished one's record when nothing is left to score it
        (the group's scoring is not waited for), else an "unfinished" line saying where it was, with the
        last lines it printed and, once it had finished, its unscored record."""
        lines = []
        now = time.monotonic()
        group_scored = self.load_error is None and (self.reward_kind == "group" or self.ruler)
        for (group, index), slot in self.slots.items():
            if (group, index) in sent:
                continue
            line = {"group": group, "index": index}
            record = slot.record
            if record is not None and (record["error"] is not None or not group_scored):
                lines.append({**line, "kind": "trajectory", "trajectory": record})
                continue
            line.update(kind="unfinished", state="waiting", logs=[])
            if record is not None:
                line.update(state="scoring", logs=list(record["logs"])[-REPORT_LOG_LINES:], trajectory=record)
            elif slot.log is not None:
                line.update(state="running", logs=slot.log.tail(REPORT_LOG_LINES))
            if slot.state != "waiting":
                line["seconds"] = round(now - slot.started, 3)
            lines.append(line)
        return lines

    async def run_one(self, group: dict, index: int) -> tuple[dict, list[Trajectory]]:
        slot = self.slots[(group["index"], index)]
        async with self.semaphore:
            log, usage = RolloutLog(), Usage()
            slot.log, slot.started, slot.state = log, time.monotonic(), "running"
            current_log.set(log)
            current_usage.set(usage)
            started = time.monotonic()
            trajectories, grouping, error = [], BY_POSITION, self.load_error
            scenario = Scenario(copy.deepcopy(group["scenario"]))
            timing: dict[str, int] = {}
            if error is None:
                trajectories, grouping, error = await self._rollout_and_reward(scenario, timing)
            record = rollout_record(trajectories, grouping)
            record.update(
                logs=log.finish() + record["logs"],
                error=error,
                duration_ms=int((time.monotonic() - started) * 1000),
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                **timing,
            )
            if error is not None:
                record["reward"] = None
            settle_others(record)
            record = bounded_record(record)
            slot.record, slot.state = record, "finished"
            return record, trajectories if error is None else trajectories[:1]

    async def _rollout_and_reward(self, scenario: Scenario, timing: dict) -> tuple[list[Trajectory], str, str | None]:
        """Runs the rollout and then, when it is per trajectory, the reward function on each trajectory it
        returned: (the trajectories, how they are grouped, the error or None). The reward's time goes to
        timing["reward_ms"], for the run's reward-health panel."""
        task = asyncio.current_task()
        self.watchdog.deadlines[task] = time.monotonic() + self.timeout_s
        trajectories, grouping, stage = [], BY_POSITION, "rollout"
        try:
            async with asyncio.timeout(self.timeout_s) as deadline:
                returned = await call_maybe_async(self.rollout, self.model, scenario)
                trajectories, grouping = await returned_trajectories(returned)
                stage = "reward"
                if (error := await self._reward_each(trajectories, scenario, timing)) is not None:
                    return trajectories, grouping, error
                stage = "result"
                for trajectory in trajectories:
                    trajectory.to_record()  # unserialisable content is this rollout's error, not the batch's
            return trajectories, grouping, None
        except RolloutTimeout:
            error = f"Timed out: the {stage} did not finish within {self.timeout_s:g} s (wall clock)."
        except TimeoutError as exc:
            if deadline.expired():
                error = f"Timed out: the {stage} did not finish within {self.timeout_s:g} s (wall clock)."
            else:
                error = stage_error(stage, exc, self.user_files)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            error = stage_error(stage, exc, self.user_files)
        finally:
            self.watchdog.deadlines.pop(task, None)
        return trajectories, grouping, error

    async def _reward_each(self, trajectories: list[Trajectory], scenario: Scenario, timing: dict) -> str | None:
        """Each trajectory's reward: the per-trajectory reward function's, or the one the rollout set. The
        error of a rollout that set none, or None."""
        for n, trajectory in enumerate(trajectories):
            if self.reward_kind == "trajectory":
                reward_started = time.monotonic()
                try:
                    trajectory.reward = check_reward(await call_maybe_async(self.reward, trajectory, scenario))
                finally:
                    timing["reward_ms"] = timing.get("reward_ms", 0) + int((time.monotonic() - reward_started) * 1000)
            elif self.reward_kind is None:
                trajectory.reward = check_reward(trajectory.reward)
                if trajectory.reward is None and not self.ruler:
                    which = f" (trajectory {n} of the {len(trajectories)} it returned)" if len(trajectories) > 1 else ""
                    return f"The rollout set no trajectory.reward{which} and no reward function is attached."
        return None

    async def score_group(self, group: dict, records: list[tuple[dict, list[Trajectory]]]) -> None:
        scored = self.one_each(records, "a score_group reward function")
        if not scored:
            return
        scenario = Scenario(copy.deepcopy(group["scenario"]))
        error = None
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout_s):
                rewards = await call_maybe_async(self.reward, TrajectoryGroup(t for _, t in scored), scenario)
            rewards = list(rewards)
            if len(rewards) != len(scored):
                raise ValueError(f"score_group returned {len(rewards)} rewards for {len(scored)} trajectories")
            rewards = [check_reward(r) for r in rewards]
        except TimeoutError:
            error = f"Timed out: score_group did not finish within {self.timeout_s:g} s (wall clock)."
        except Exception as exc:
            error = stage_error("reward", exc, self.user_files)
        share_ms = int((time.monotonic() - started) * 1000 / len(scored))
        for i, (record, traj) in enumerate(scored):
            record["reward_ms"] = share_ms
            if error is None:
                traj.reward = rewards[i]
                record.update(reward=rewards[i], metrics={**record["metrics"], **plain_metrics(traj)})
            else:
                record.update(reward=None, error=error)

    async def ruler_group(self, group: dict, records: list[tuple[dict, list[Trajectory]]]) -> None:
        """The judge scores the group's finished rollouts side by side; its scores become their rewards
        (artweb_sdk.ruler.apply_score says what else is kept). The time it took goes to judge_ms, for the
        step's timings. A judge that gives no usable answer fails the group's rollouts: they have no
        reward under the run's scoring.
        """
        scored = self.one_each(records, "RULER")
        if any(traj.additional_histories for _, traj in scored):
            error = "RULER does not score trajectories with additional_histories (ART's RULER refuses them too)."
            for record, _ in scored:
                record.update(reward=None, error=error)
            return
        if not scored:
            return
        scores, error, judge_ms = await self.judge(group, [t for _, t in scored])
        for i, (record, traj) in enumerate(scored):
            record["judge_ms"] = judge_ms
            if error is not None:
                record.update(reward=None, error=error)
                continue
            apply_score(record, scores[i])
            traj.reward = scores[i].score

    @staticmethod
    def one_each(records: list[tuple[dict, list[Trajectory]]], scorer: str) -> list[tuple[dict, Trajectory]]:
        """The group's finished rollouts as (record, trajectory) for a scorer that compares one trajectory per
        rollout; one that returned several fails, saying so."""
        scored = []
        for record, trajectories in records:
            if record["error"] is not None or not trajectories:
                continue
            if "more_trajectories" in record:
                n = len(trajectories)
                record.update(
                    reward=None,
                    error=f"rollout() returned {n} {'trajectory' if n == 1 else 'trajectories'} (a list or a "
                    f"TrajectoryGroup), and {scorer} scores one trajectory per rollout. Set each trajectory's reward "
                    "in the rollout, or use a per-trajectory reward function, `reward(trajectory, scenario)`.",
                )
                settle_others(record)
                continue
            scored.append((record, trajectories[0]))
        return scored

    async def judge(self, group: dict, trajectories: list[Trajectory]) -> tuple[list[TrajectoryScore], str | None, int]:
        """The RULER judge's scores of the trajectories side by side: (scores, None, milliseconds), or
        ([], the error saying why there are none, milliseconds)."""
        started = time.monotonic()
        client = judge_client()
        error, scores = None, []
        try:
            async with asyncio.timeout(self.timeout_s):
                scores = await score_message_lists(
                    client, self.judge_model, [t.messages() for t in trajectories], scenario=group["scenario"]
                )
        except TimeoutError:
            error = f"RULER did not score this group: the judge did not answer within {self.timeout_s:g} s."
        except RulerError as exc:
            error = f"RULER did not score this group: {exc}"
        except Exception as exc:
            error = f"RULER did not score this group: {type(exc).__name__}: {exc}"
        finally:
            await client.close()
        return scores, error, int((time.monotonic() - started) * 1000)
