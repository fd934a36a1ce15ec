"""The sandbox process: runs a person's rollout script and reward function on a batch of groups.

Started by rollouts.runtime.sandbox with a clean environment, resource limits and a working directory
of its own; never imported by artweb itself. It may be started before its batch is known: it then
first imports the SDK and the OpenAI client (about a CPU-second that the batch need not wait for). It
waits for one line on its control pipe, the batch's environment, which says that the batch's files
are in place. No user code is loaded before that line. Then it reads the batch description (a JSON file
named on the command line), runs every rollout concurrently on one asyncio loop, and writes one JSON
line per finished trajectory to the result pipe, so whatever was finished survives if this process dies.

Timeouts: `asyncio.timeout` stops a rollout that waits too long; a rollout that blocks the loop
itself (`while True: pass`) is interrupted by a watchdog thread, which signals the main thread so
that a RolloutTimeout is raised inside the blocking code, failing that rollout and no other.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import io
import json
import linecache
import os
import signal
import sys
import threading
import time
import traceback
import types
from contextvars import ContextVar
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Our `art` package must win over a real openpipe-art install; the weave stand-in must lose to a real
# weave, so it goes last on the path.
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent / "guest_fallbacks"))

from artweb_sdk import Scenario, TrainableModel, Trajectory, TrajectoryGroup
from artweb_sdk.model import Endpoint, Usage, current_usage
from artweb_sdk.ruler import RulerError, apply_score, judge_client, score_message_lists
from artweb_sdk.trajectory import check_reward

MAX_LOG_LINES = 500
MAX_LOG_LINE_CHARS = 4000
MAX_RECORD_BYTES = 4 << 20  # one trajectory; larger ones are replaced by an error. Set from the batch
# (SandboxLimits.record_bytes): the worker refuses larger records itself, this only keeps their logs.


class RolloutTimeout(BaseException):
    """Raised inside a rollout that overran its wall-clock limit.

    A BaseException, so a script's `except Exception:` cannot swallow it and keep going.
    """


# --- per-rollout logs ---------------------------------------------------------------------------------


class RolloutLog:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self._partial = ""
        self.dropped = 0

    def write(self, text: str) -> None:
        text = self._partial + text
        *complete, self._partial = text.split("\n")
        for line in complete:
            self._add(line)

    def _add(self, line: str) -> None:
        if len(self.lines) >= MAX_LOG_LINES:
            self.dropped += 1
            return
        self.lines.append(line[:MAX_LOG_LINE_CHARS])

    def finish(self) -> list[str]:
        if self._partial:
            self._add(self._partial)
            self._partial = ""
        if self.dropped:
            self.lines.append(f"[{self.dropped} more log lines dropped]")
        return self.lines


current_log: ContextVar[RolloutLog | None] = ContextVar("artweb_log", default=None)


class _RoutedStream(io.TextIOBase):
    """sys.stdout/sys.stderr: text written inside a rollout goes to that rollout's logs."""

    def __init__(self, fallback) -> None:
        self._fallback = fallback

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        log = current_log.get()
        if log is None:
            self._fallback.write(text)
        else:
            log.write(text)
        return len(text)

    def flush(self) -> None:
        self._fallback.flush()


# --- results -----------------------------------------------------------------------------------------


class ResultPipe:
    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pid = os.getpid()

    def send(self, message: dict) -> None:
        if os.getpid() != self._pid:
            # A process forked by the script reached our code: it must not report or run other rollouts.
            os._exit(0)
        data = (json.dumps(message, allow_nan=False) + "\n").encode()
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]


def describe_error(exc: BaseException, user_files: set[str]) -> str:
    """'Type: message' and the traceback through the person's own code (not artweb's or libraries')."""
    te = traceback.TracebackException.from_exception(exc, capture_locals=False)
    head = "".join(te.format_exception_only()).strip()
    frames = [f for f in te.stack if Path(f.filename).name in user_files]
    if not frames:
        return head
    te.stack = traceback.StackSummary.from_list(frames)
    return head + "\n\nTraceback (your code, most recent call last):\n" + "".join(te.stack.format()).rstrip()


# --- process limit ------------------------------------------------------------------------------------

PROCESS_EVENTS = {"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen"}


def limit_processes(budget: int) -> None:
    """At most `budget` processes started by the script, and none by the processes it forks.

    RLIMIT_NPROC does this for an unprivileged sandbox user, but is not enforced for root; an audit
    hook (which the script cannot remove) covers that case from inside. Forbidding forks in forked
    children keeps the total bounded rather than exponential.
    """
    state = {"left": budget, "forked": False}
    os.register_at_fork(after_in_child=lambda: state.update(forked=True))

    def hook(event: str, _args) -> None:
        if event not in PROCESS_EVENTS:
            return
        if state["forked"] and event in ("os.fork", "os.forkpty"):
            raise PermissionError("a process forked inside the sandbox may not fork again")
        state["left"] -= 1
        if state["left"] < 0:
            raise PermissionError(f"the sandbox may start at most {budget} processes")

    sys.addaudithook(hook)


# --- loading the person's code -----------------------------------------------------------------------


def load_module(path: Path, name: str) -> types.ModuleType:
    source = path.read_text(encoding="utf-8")
    linecache.cache[path.name] = (len(source), None, source.splitlines(True), path.name)
    code = compile(source, path.name, "exec")
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    exec(code, module.__dict__)
    return module


async def call_maybe_async(fn, *args):
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


# --- the watchdog ------------------------------------------------------------------------------------


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


# --- running a batch ---------------------------------------------------------------------------------


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

    def load(self, workdir: Path) -> None:
        try:
            script = load_module(workdir / "rollout.py", "rollout_script")
            self.rollout = getattr(script, "rollout", None)
            if not callable(self.rollout):
                raise AttributeError("the rollout script defines no function named `rollout(model, scenario)`")
            if self.reward_kind:
                module = load_module(workdir / "reward.py", "reward_function")
                name = "score_group" if self.reward_kind == "group" else "reward"
                self.reward = getattr(module, name, None)
                if not callable(self.reward):
                    raise AttributeError(f"the reward function file defines no function named `{name}`")
        except BaseException as exc:
            self.load_error = "Loading your code failed: " + describe_error(exc, self.user_files)

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

    async def run_one(self, group: dict, index: int) -> tuple[dict, Trajectory | None]:
        async with self.semaphore:
            log, usage = RolloutLog(), Usage()
            current_log.set(log)
            current_usage.set(usage)
            started = time.monotonic()
            trajectory, error = None, self.load_error
            scenario = Scenario(copy.deepcopy(group["scenario"]))
            timing: dict[str, int] = {}
            if error is None:
                trajectory, error = await self._rollout_and_reward(scenario, timing)
            record = trajectory.to_record() if trajectory is not None else _empty_record()
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
            return _bounded(record), trajectory

    async def _rollout_and_reward(self, scenario: Scenario, timing: dict) -> tuple[Trajectory | None, str | None]:
        """Runs the rollout and then, when it is per trajectory, the reward function; the reward's time goes
        to timing["reward_ms"], for the run's reward-health panel."""
        task = asyncio.current_task()
        self.watchdog.deadlines[task] = time.monotonic() + self.timeout_s
        trajectory, stage = None, "rollout"
        try:
            async with asyncio.timeout(self.timeout_s) as deadline:
                trajectory = await call_maybe_async(self.rollout, self.model, scenario)
                if not isinstance(trajectory, Trajectory):
                    bad, trajectory = trajectory, None
                    raise TypeError(f"rollout() must return an art.Trajectory, not {type(bad).__name__}")
                stage = "reward"
                if self.reward_kind == "trajectory":
                    reward_started = time.monotonic()
                    try:
                        trajectory.reward = check_reward(await call_maybe_async(self.reward, trajectory, scenario))
                    finally:
                        timing["reward_ms"] = int((time.monotonic() - reward_started) * 1000)
                elif self.reward_kind is None:
                    trajectory.reward = check_reward(trajectory.reward)
                    if trajectory.reward is None and not self.ruler:
                        return trajectory, "The rollout set no trajectory.reward and no reward function is attached."
                stage = "result"
                trajectory.to_record()  # unserialisable content is this rollout's error, not the batch's
            return trajectory, None
        except RolloutTimeout:
            return trajectory, f"Timed out: the {stage} did not finish within {self.timeout_s:g} s (wall clock)."
        except TimeoutError as exc:
            if deadline.expired():
                return trajectory, f"Timed out: the {stage} did not finish within {self.timeout_s:g} s (wall clock)."
            return trajectory, _stage_error(stage, exc, self.user_files)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            return trajectory, _stage_error(stage, exc, self.user_files)
        finally:
            self.watchdog.deadlines.pop(task, None)

    async def score_group(self, group: dict, records: list[tuple[dict, Trajectory | None]]) -> None:
        scored = [(record, traj) for record, traj in records if record["error"] is None and traj is not None]
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
            error = _stage_error("reward", exc, self.user_files)
        share_ms = int((time.monotonic() - started) * 1000 / len(scored))
        for i, (record, traj) in enumerate(scored):
            record["reward_ms"] = share_ms
            if error is None:
                traj.reward = rewards[i]
                record.update(reward=rewards[i], metrics={**record["metrics"], **_plain_metrics(traj)})
            else:
                record.update(reward=None, error=error)

    async def ruler_group(self, group: dict, records: list[tuple[dict, Trajectory | None]]) -> None:
        """The judge scores the group's finished rollouts side by side; its scores become their rewards
        (artweb_sdk.ruler.apply_score says what else is kept). The time it took goes to judge_ms, for the
        step's timings. A judge that gives no usable answer fails the group's rollouts: they have no
        reward under the run's scoring.
        """
        scored = [(record, traj) for record, traj in records if record["error"] is None and traj is not None]
        if not scored:
            return
        started = time.monotonic()
        client = judge_client()
        error = None
        try:
            async with asyncio.timeout(self.timeout_s):
                scores = await score_message_lists(
                    client, self.judge_model, [t.messages() for _, t in scored], scenario=group["scenario"]
                )
        except TimeoutError:
            error = f"RULER did not score this group: the judge did not answer within {self.timeout_s:g} s."
        except RulerError as exc:
            error = f"RULER did not score this group: {exc}"
        except Exception as exc:
            error = f"RULER did not score this group: {type(exc).__name__}: {exc}"
        finally:
            await client.close()
        judge_ms = int((time.monotonic() - started) * 1000)
        for i, (record, traj) in enumerate(scored):
            record["judge_ms"] = judge_ms
            if error is not None:
                record.update(reward=None, error=error)
                continue
            apply_score(record, scores[i])
            traj.reward = scores[i].score


# --- score-only mode: stored trajectories scored again ---------------------------------------------


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
    )


class ScoreBatch(Batch):
    """Score mode: no rollout script and no policy. Each group's stored trajectories are rebuilt as the
    reward function saw them in the step and scored by it (or by the RULER judge); one "score" line per
    trajectory: {"reward", "metrics", "error", "reward_ms"}."""

    def load(self, workdir: Path) -> None:
        if not self.reward_kind:
            return
        try:
            module = load_module(workdir / "reward.py", "reward_function")
            name = "score_group" if self.reward_kind == "group" else "reward"
            self.reward = getattr(module, name, None)
            if not callable(self.reward):
                raise AttributeError(f"the reward function file defines no function named `{name}`")
        except BaseException as exc:
            self.load_error = "Loading your code failed: " + describe_error(exc, self.user_files)

    async def run_group(self, group: dict) -> None:
        trajectories = [restore_trajectory(r) for r in group["trajectories"]]
        if self.load_error is not None:
            scores = [_score(None, {}, self.load_error, None) for _ in trajectories]
        elif self.ruler:
            scores = await self.ruler_scores(group, trajectories)
        elif self.reward_kind == "group":
            scores = await self.group_scores(group, trajectories)
        else:
            scores = await asyncio.gather(*(self.score_one(group, t) for t in trajectories))
        for index, score in enumerate(scores):
            self.pipe.send({"kind": "score", "group": group["index"], "index": index, "score": _bounded_score(score)})

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
                    else _stage_error("reward", exc, self.user_files)
                )
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    raise
                error = _stage_error("reward", exc, self.user_files)
            finally:
                self.watchdog.deadlines.pop(task, None)
            reward_ms = int((time.monotonic() - started) * 1000)
            return _score(reward, _safe_metrics(trajectory), error, reward_ms)

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
            error = _stage_error("reward", exc, self.user_files)
        finally:
            self.watchdog.deadlines.pop(task, None)
        share_ms = int((time.monotonic() - started) * 1000 / max(1, len(trajectories)))
        return [
            _score(rewards[i] if error is None else None, _safe_metrics(t), error, share_ms)
            for i, t in enumerate(trajectories)
        ]

    async def ruler_scores(self, group: dict, trajectories: list[Trajectory]) -> list[dict]:
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
        judge_ms = int((time.monotonic() - started) * 1000)
        if error is not None:
            return [_score(None, {}, error, judge_ms) for _ in trajectories]
        return [_score(s.score, {"ruler_score": s.score}, None, judge_ms, explanation=s.explanation) for s in scores]


def _score(reward, metrics: dict, error: str | None, reward_ms: int | None, explanation: str | None = None) -> dict:
    score = {"reward": reward if error is None else None, "metrics": metrics, "error": error, "reward_ms": reward_ms}
    if explanation:
        score["metrics"] = {**metrics, "ruler_explanation": str(explanation)[:2000]}
    return score


def _safe_metrics(trajectory: Trajectory) -> dict:
    try:
        return _plain_metrics(trajectory)
    except Exception:
        return {}


def _bounded_score(score: dict) -> dict:
    if len(json.dumps(score, default=str)) <= MAX_RECORD_BYTES:
        return score
    return {**score, "metrics": {}, "error": score["error"] and score["error"][:4000]}


def _stage_error(stage: str, exc: BaseException, user_files: set[str]) -> str:
    prefix = {"rollout": "", "reward": "The reward function failed: ", "result": "The trajectory is not JSON: "}
    return prefix.get(stage, "") + describe_error(exc, user_files)


def _plain_metrics(traj: Trajectory) -> dict:
    return traj.to_record()["metrics"]


def _empty_record() -> dict:
    return {"messages": [], "tools": None, "reward": None, "metrics": {}, "metadata": {}, "logs": []}


def _bounded(record: dict) -> dict:
    size = len(json.dumps(record, default=str))
    if size <= MAX_RECORD_BYTES:
        return record
    return {
        **_empty_record(),
        "logs": record["logs"][-50:],
        "error": f"The trajectory is {size / (1 << 20):.1f} MB as JSON; the limit is {MAX_RECORD_BYTES / (1 << 20):.1f} MB.",
        "duration_ms": record["duration_ms"],
        "prompt_tokens": record["prompt_tokens"],
        "completion_tokens": record["completion_tokens"],
    }


def start_relay(socket_path: str) -> int:
    """Listen on 127.0.0.1 (inside the jail: its own loopback) and pipe each connection to the inference
    proxy's unix socket; returns the port. Any OpenAI client, the SDK's or one the script builds from
    OPENAI_BASE_URL, reaches the model this way. The proxy, outside the jail, decides what passes."""
    ready = threading.Event()
    found: dict[str, int] = {}

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def connection(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_unix_connection(socket_path)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pump(client_r, up_w), pump(up_r, client_w))

    async def serve() -> None:
        server = await asyncio.start_server(connection, "127.0.0.1", 0)
        found["port"] = server.sockets[0].getsockname()[1]
        ready.set()
        await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(serve()), name="artweb-relay", daemon=True).start()
    if not ready.wait(10):
        raise RuntimeError("the inference relay did not start")
    return found["port"]


def warm_up() -> None:
    """Import what every rollout script uses: the SDK (imported above), `art`, and the OpenAI client with
    the modules its first chat completion loads, and build the SDK client's TLS context; each would
    otherwise cost the batch's first requests their time. Nothing here opens a connection."""
    # httpcore opens its connections through anyio's asyncio backend, imported on the first one.
    import anyio._backends._asyncio  # noqa: F401
    import art
    import httpcore._backends.anyio  # noqa: F401

    handle = art.TrainableModel(name="warm-up", _endpoint=Endpoint(base_url="http://127.0.0.1:9/v1"))
    _ = handle.openai_client().chat.completions  # its first access imports the chat resources and HTTP/1.1


MAX_CONTROL_BYTES = 1 << 20


def wait_for_batch(fd: int) -> dict[str, str]:
    """Block until the worker sends the batch's environment (one JSON line); exit quietly if it closes the
    pipe instead (a pre-started process that no batch took)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 65536)
        if not chunk or len(data) > MAX_CONTROL_BYTES:
            os._exit(0)
        data += chunk
    os.close(fd)
    message = json.loads(data)
    return {str(k): str(v) for k, v in message["env"].items()}


def main() -> None:
    if os.environ.pop("ARTWEB_WARM_UP", "") == "1":  # started ahead of its batch: the imports are free now
        warm_up()
    os.environ.update(wait_for_batch(int(os.environ.pop("ARTWEB_CONTROL_FD"))))
    spec_path = Path(sys.argv[1])
    spec = json.loads(spec_path.read_text())
    global MAX_RECORD_BYTES
    MAX_RECORD_BYTES = int(spec.get("record_bytes", MAX_RECORD_BYTES))
    pipe = ResultPipe(int(os.environ["ARTWEB_RESULT_FD"]))
    port = start_relay(os.environ["ARTWEB_PROXY_SOCKET"])
    os.environ["OPENAI_BASE_URL"] = f"http://127.0.0.1:{port}/v1"
    if os.environ.get("ARTWEB_EGRESS_SOCKET"):
        # HTTPS to the run's own tracing service only (the worker's proxy checks the host); the model
        # stays on the plain local relay.
        os.environ["HTTPS_PROXY"] = f"http://127.0.0.1:{start_relay(os.environ['ARTWEB_EGRESS_SOCKET'])}"
        os.environ["NO_PROXY"] = "127.0.0.1,localhost"
    sys.stdout = _RoutedStream(sys.__stdout__)
    sys.stderr = _RoutedStream(sys.__stderr__)
    limit_processes(int(spec["max_processes"]))
    weave = _weave_start()
    batch = (ScoreBatch if spec.get("mode") == "score" else Batch)(spec, pipe)
    batch.load(spec_path.parent)
    asyncio.run(batch.run())
    _weave_finish(weave)
    pipe.send({"kind": "done"})
    # Every result is sent and the worker kills the sandbox once it reads "done": skip the interpreter's
    # teardown (a few hundred ms of CPU with the OpenAI client loaded, taken from the batch's other
    # sandboxes) and whatever exit hooks or threads the script left.
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (OSError, ValueError):  # a log past its size limit, a closed stream: nothing left to say
            pass
    os._exit(0)


def _weave_start():
    """With the run's Weave project configured, trace @weave.op calls into it; a Weave that cannot
    start (no server, bad key) is switched off with one line in the log and never fails a rollout."""
    project = os.environ.get("WEAVE_PROJECT")
    if not project:
        return None
    try:
        import weave

        return weave.init(project)
    except Exception as exc:
        os.environ["WEAVE_DISABLED"] = "true"
        print(f"Weave tracing is off for this batch: {type(exc).__name__}: {exc}", file=sys.__stderr__)
        return None


def _weave_finish(client) -> None:
    if client is None:
        return
    done = threading.Event()

    def flush():
        try:
            client.finish()
        except Exception:
            pass
        done.set()

    threading.Thread(target=flush, daemon=True).start()
    done.wait(10.0)  # flushing traces must not hold the batch's results back for long


if __name__ == "__main__":
    main()
