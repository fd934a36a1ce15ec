"""Run a person's rollout script and reward function on a batch of scenarios, never in this process.

Each batch is spread over a few sandbox processes (a group always stays within one); each process
runs its rollouts concurrently on asyncio (rollouts mostly wait on the inference server). The batch
runs in a jail (rollouts.runtime.jail): its own user, pid, mount, ipc, uts and network namespaces, an
unprivileged uid, a read-only view of the interpreter, the SDK and its own files, a private /tmp, and
cgroup limits on memory, processes and CPU for the whole batch. Its only way out is one unix socket
to the worker's inference proxy (rollouts.runtime.proxy), which passes the OpenAI inference routes for
the batch's own model name (and its RULER judge's) and nothing else; the guest relays 127.0.0.1 inside
the jail to it, so OPENAI_BASE_URL works for any client.

Results come back as one JSON line per finished trajectory on a pipe, so a process that dies (os._exit,
a segfault, a limit) loses only its unfinished rollouts, which are recorded as errors saying why. Every
line is checked (rollouts.runtime.records) before it is believed; a sandbox that breaks the protocol
(garbage, a flood, a record for a rollout it does not own) is killed and its unfinished rollouts fail.

A run's next batch can be started ahead, once its step's update is done: a fresh jail whose interpreter has imported
the SDK and the OpenAI client and waits for the batch; why this design, and why it keeps each batch as
isolated as a cold one, is under "Pre-started batches" below.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import queue
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rollouts.runtime import Cancelled, TooManyErrors
from rollouts.runtime.egress import EgressPolicy
from rollouts.runtime.jail import Jail, JailConfig, JailLimits, guest_python_args
from rollouts.runtime.proxy import InferenceProxy, Upstream
from rollouts.runtime.records import (
    RECORD_ENVELOPE_BYTES,
    RecordError,
    ResultBudget,
    check_score,
    check_trajectory,
    line_limit,
    megabytes,
    parse_line,
)
from rollouts.runtime.seccomp import filter_fd
from rollouts.runtime.validation import validate_reward

logger = logging.getLogger(__name__)

RUNTIME = Path(__file__).resolve().parent
GUEST_DIR = RUNTIME / "guest"
FALLBACKS_DIR = RUNTIME / "guest_fallbacks"
GUEST = GUEST_DIR / "_artweb_guest.py"
READ_CHUNK = 1 << 20  # bytes read from one sandbox per turn of the loop, so a flood cannot hold it


@dataclass(frozen=True)
class SandboxLimits:
    rollout_timeout_s: float = 120.0  # wall clock per rollout, reward included
    batch_timeout_s: float | None = None  # wall clock for the whole batch; None: from the rollout limit
    memory_mb: int = 2048  # every process of the batch together (cgroup); also each one's address space
    cpu_seconds: int | None = None  # CPU time per sandbox process; None: the batch timeout
    cpus: float | None = None  # cores the batch may keep busy at once; None: one per sandbox process
    max_processes: int = 64  # processes the script may start, the whole batch together
    file_mb: int = 64  # largest file the sandbox may write, its output log included
    scratch_mb: int = 256  # the private /tmp
    # What the batch may send back, enforced by the worker on every line it reads (rollouts.runtime.records):
    # user code shares the guest's process and can write to the result pipe itself. Records are at most one
    # per rollout, then a "done" line per sandbox process: the protocol refuses any other.
    record_bytes: int = 4 << 20  # one trajectory or score as JSON, as the guest is told; a larger one fails
    record_depth: int = 100  # nesting levels of a result line, checked before parsing; deeper stops the sandbox
    batch_bytes: int = 256 << 20  # the batch's records together; one that no longer fits fails its rollout


@dataclass
class RolloutRequest:
    script: str  # the rollout script's source
    reward: str | None  # the reward function's source; None: the script sets trajectory.reward
    scenarios: list[dict]  # one group per scenario
    group_size: int
    base_url: str  # the inference server's OpenAI-compatible endpoint, e.g. http://127.0.0.1:8100/v1
    model_name: str  # the served model or adapter name, e.g. "run-12@3": the only one the batch may call
    api_key: str | None = None  # the inference server's key; held by the proxy, never seen by user code
    sampling: dict = field(default_factory=dict)  # defaults for every chat completion request
    concurrency: int = 16  # rollouts in flight across the batch
    max_exceptions: int | float = 1.0  # failed rollouts tolerated: a count, or a fraction when < 1
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    sandboxes: int | None = None  # processes to spread the groups over; None: default_sandboxes()
    python: str | None = None  # interpreter for the sandbox (needs openai and httpx); None: this one
    step: int = 0  # exposed to scripts as model.get_step()
    env: dict[str, str] = field(default_factory=dict)  # observability settings; only PASSED_ENV keys pass
    jail: JailConfig = field(default_factory=JailConfig)
    vocab_size: int | None = None  # token ids in records must be below this (the model's embedding rows)
    extra_models: dict[str, Upstream] = field(default_factory=dict)  # more names the batch may call (a judge)
    egress_hosts: tuple[str, ...] = ()  # "host:port" the batch may tunnel to over HTTPS (its Weave project)
    # What the egress guard allows those tunnels beyond public addresses on ports 443 and 80 (the operator's).
    egress_policy: EgressPolicy = field(default_factory=EgressPolicy)
    # The judge for RULER: model_name or a key of extra_models. Scripts get it as art.rewards' default judge.
    judge_model: str | None = None
    ruler: bool = False  # the judge scores every group after its rollouts; its scores become the rewards
    # The batches of one run: a batch takes the jail pre-started for its key (when it has the batch's shape),
    # and, with prestart_next, pre-starts one for the key's next batch (see "Pre-started batches").
    warm_key: str | None = None
    prestart_next: bool = False


# What a run's observability settings may put in the sandbox's environment (Weave tracing); nothing else
# from the caller's environment ever reaches user code.
PASSED_ENV = ("WEAVE_PROJECT", "WANDB_API_KEY", "WANDB_BASE_URL", "WF_TRACE_SERVER_URL", "WANDB_MODE", "WANDB_DIR")


@dataclass
class GroupResult:
    scenario: dict
    trajectories: list[dict]  # group_size trajectory records, in rollout order

    @property
    def rewards(self) -> list[float | None]:
        return [t["reward"] for t in self.trajectories]

    @property
    def errors(self) -> list[str]:
        return [t["error"] for t in self.trajectories if t["error"]]

    @property
    def judge_s(self) -> float:
        """Seconds the RULER judge took over this group (0.0 when it was not judged). The sandbox's
        word, so only a sane value counts: a whole number of milliseconds within a day."""
        ms = [t.get("judge_ms") for t in self.trajectories]
        ms = [v for v in ms if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 86_400_000]
        return max(ms, default=0) / 1000

    def to_dict(self) -> dict:
        return {"scenario": self.scenario, "trajectories": self.trajectories}


def failed_record(error: str, duration_ms: int = 0) -> dict:
    return {
        "messages": [],
        "tools": None,
        "reward": None,
        "metrics": {},
        "metadata": {},
        "logs": [],
        "error": error,
        "duration_ms": duration_ms,
        "prompt_tokens": 0,
        "completion_tokens": 0,
    }


def _exceptions_budget(max_exceptions: float, total: int) -> float:
    if isinstance(max_exceptions, float) and max_exceptions < 1:
        return max_exceptions * total
    return float(max_exceptions)


def default_sandboxes() -> int:
    """Sandbox processes per batch: one per two cores, at most 4.

    Rollouts mostly wait on the inference server, so a process's asyncio loop keeps many in flight; more
    processes only help when user code burns CPU. Each one pays ~1 CPU-second of start-up (Python and
    the openai client), which on a 2-core machine was ~2 s of every step with 4 of them.
    """
    return max(1, min(4, (os.cpu_count() or 2) // 2))


_proxy_lock = threading.Lock()
_proxy: InferenceProxy | None = None


def inference_proxy() -> InferenceProxy:
    """This process's proxy between jails and inference servers (one thread, started on first use)."""
    global _proxy
    with _proxy_lock:
        if _proxy is None:
            _proxy = InferenceProxy()
        return _proxy


def _pump(sandboxes, selector, *, batch_timeout: float, should_stop, tick, cancelled: str, unfinished: str) -> None:
    """Read the sandboxes' pipes until every one has finished, the batch's deadline passes (the rest are
    killed, each unfinished item saying `unfinished`) or the caller cancels; `tick` takes what arrived after
    each read and may raise to end the batch early."""
    deadline = time.monotonic() + batch_timeout
    while any(not box.finished for box in sandboxes):
        if should_stop():
            raise Cancelled(cancelled)
        if time.monotonic() > deadline:
            for box in sandboxes:
                box.kill(f"The batch did not finish within its {batch_timeout:g} s limit; {unfinished}")
            return
        for key, _ in selector.select(timeout=0.2):
            key.data.read()
            # A closed pipe stays readable, and so does one whose sandbox was cut off for breaking the
            # protocol (nothing more is read from it): stop watching both.
            if key.data.eof or key.data.finished:
                selector.unregister(key.fd)
        for box in sandboxes:
            box.check_exit()
        tick()


def run_rollouts(
    request: RolloutRequest,
    should_stop: Callable[[], bool] = lambda: False,
    on_trajectory: Callable[[int, int, dict], None] | None = None,
) -> list[GroupResult]:
    """Run group_size rollouts per scenario in jailed sandbox processes; one GroupResult per scenario.

    should_stop is polled a few times a second; when it returns True the sandboxes are killed and
    Cancelled is raised. on_trajectory(group, index, record) is called as each trajectory arrives.
    Raises TooManyErrors as soon as more rollouts failed than max_exceptions allows, and JailUnavailable
    (before any user code runs) when the jail cannot be built here.

    With a warm_key, the batch takes the jail pre-started for that key when it has the batch's shape (see
    "Pre-started batches" below), and, with prestart_next, pre-starts one for the key's next batch once it
    has ended well.
    """
    if request.group_size < 1:
        raise ValueError("group_size must be at least 1")
    if request.judge_model is not None and request.judge_model not in (request.model_name, *request.extra_models):
        raise ValueError(f"the judge {request.judge_model!r} is neither the batch's model nor one of its extra_models")
    if request.ruler and request.judge_model is None:
        raise ValueError("a batch scored by RULER needs a judge_model")
    if not request.scenarios:
        return []
    shape, batch_timeout = _rollout_shape(request)
    started = prestarted.take(request.warm_key, shape) if request.warm_key else None
    results = _rollouts_in(
        started or _StartedBatch.start(shape, prefix="artweb-batch-"),
        request,
        batch_timeout,
        should_stop,
        on_trajectory,
    )
    if request.warm_key and request.prestart_next:
        prestarted.add_soon(request.warm_key, shape)
    return results


def prestart_batch(request: RolloutRequest) -> None:
    """Pre-start the jail for the next batch of request.warm_key, shaped as this request's (what a batch
    with prestart_next does as it ends), for a caller that picks the moment itself; returns at once."""
    if request.warm_key is None:
        raise ValueError("only a batch with a warm_key can be pre-started")
    prestarted.add_soon(request.warm_key, _rollout_shape(request)[0])


def _rollout_shape(request: RolloutRequest) -> tuple[BatchShape, float]:
    """The batch's shape and its wall-clock limit in seconds."""
    limits = request.limits
    n_groups = len(request.scenarios)
    total = n_groups * request.group_size
    # Under RULER each group waits for its judge after its rollouts, bounded by the same limit: one more turn.
    batch_timeout = limits.batch_timeout_s or (
        limits.rollout_timeout_s * (math.ceil(total / max(1, request.concurrency)) + int(request.ruler)) + 60.0
    )
    n_sandboxes = max(1, min(request.sandboxes or default_sandboxes(), n_groups))
    return BatchShape.of(request, n_sandboxes, limits.cpu_seconds or int(batch_timeout) + 10), batch_timeout


def _rollouts_in(
    started: _StartedBatch,
    request: RolloutRequest,
    batch_timeout: float,
    should_stop: Callable[[], bool],
    on_trajectory: Callable[[int, int, dict], None] | None,
) -> list[GroupResult]:
    """The batch, in the jail and processes `started` (closed when it ends, whatever happens)."""
    n_groups = len(request.scenarios)
    limits = request.limits
    total = n_groups * request.group_size
    concurrency = max(1, request.concurrency)
    reward_kind = None
    if request.reward is not None:
        # An invalid reward file still runs: loading it fails in the sandbox, recorded on each rollout.
        reward_kind = validate_reward(request.reward)[0] or "trajectory"
    layout, jail, sandboxes = started.layout, started.jail, started.boxes
    n_sandboxes = len(sandboxes)
    records: list[list[dict | None]] = [[None] * request.group_size for _ in range(n_groups)]
    budget = _exceptions_budget(request.max_exceptions, total)
    failures: list[str] = []

    def collect(box: _Sandbox) -> None:
        for group, index, record in box.take():
            records[group][index] = record
            if record["error"] is not None:
                failures.append(record["error"])
            if on_trajectory is not None:
                on_trajectory(group, index, record)

    socket_path = layout.root / "sock" / "inference.sock"
    proxy = inference_proxy()
    selector = selectors.DefaultSelector()
    try:
        for k in range(n_sandboxes):
            layout.write(
                k,
                request,
                list(range(k, n_groups, n_sandboxes)),
                reward_kind,
                concurrency=math.ceil(concurrency / n_sandboxes),
            )
        proxy.open(
            socket_path, {request.model_name: Upstream(request.base_url, request.api_key), **request.extra_models}
        )
        if request.egress_hosts:
            proxy.open_egress(socket_path.with_name("egress.sock"), request.egress_hosts, request.egress_policy)
        started.hand_over(request)
        for box in sandboxes:
            selector.register(box.read_fd, selectors.EVENT_READ, box)

        def tick() -> None:
            for box in sandboxes:
                collect(box)
            if len(failures) > budget:
                raise TooManyErrors(
                    f"{len(failures)} of {total} rollouts failed (max_exceptions={request.max_exceptions}). "
                    f"The first error:\n{failures[0]}",
                    _results(request, records, "Not run: the batch stopped after too many failures."),
                )

        _pump(
            sandboxes,
            selector,
            batch_timeout=batch_timeout,
            should_stop=should_stop,
            tick=tick,
            cancelled="the rollouts were cancelled",
            unfinished="this rollout was stopped unfinished.",
        )
        for box in sandboxes:
            collect(box)
        if jail is not None and (kills := jail.cgroup.oom_kills()):
            _note_memory(records, kills, limits.memory_mb)
        return _results(request, records, None, sandboxes)
    finally:
        selector.close()
        started.close()
        proxy.close(socket_path)
        if request.egress_hosts:
            proxy.close(socket_path.with_name("egress.sock"))


def _note_memory(records: list[list[dict | None]], kills: int, memory_mb: int) -> None:
    """Say on each failed rollout that the kernel killed processes for memory: a forked child that died
    for it shows up in user code only as some later error."""
    note = (
        f"\n\nDuring this batch the kernel killed {kills} process(es) that went past the batch's memory "
        f"limit of {memory_mb} MB (all its processes together)."
    )
    for group in records:
        for record in group:
            if record is not None and record["error"] is not None and note not in record["error"]:
                record["error"] += note


def _results(request, records, missing: str | None, sandboxes=()) -> list[GroupResult]:
    reasons = {g: box.exit_reason for box in sandboxes for g in box.groups}
    return [
        GroupResult(
            scenario=scenario,
            trajectories=[
                r if r is not None else failed_record(missing or reasons.get(g) or "The rollout produced no result.")
                for r in records[g]
            ],
        )
        for g, scenario in enumerate(request.scenarios)
    ]


def dry_run(
    *,
    script: str,
    reward: str | None,
    scenarios: list[dict],
    base_url: str,
    model_name: str,
    api_key: str | None = None,
    sampling: dict | None = None,
    max_scenarios: int = 3,
    group_size: int = 1,
    timeout_s: float = 90.0,
    python: str | None = None,
    jail: JailConfig | None = None,
    vocab_size: int | None = None,
) -> dict:
    """Try a script on a few scenarios; returns within about timeout_s, with output or errors.

    The result is JSON: {"trajectories": [record + "scenario_index"], "rewards", "errors", "logs",
    "duration_ms"}. Nothing here raises for a broken script: its errors are in the result.
    """
    started = time.monotonic()
    chosen = list(scenarios[:max_scenarios])
    limits = SandboxLimits(rollout_timeout_s=max(1.0, timeout_s - 10), batch_timeout_s=timeout_s)
    request = RolloutRequest(
        script=script,
        reward=reward,
        scenarios=chosen,
        group_size=group_size,
        base_url=base_url,
        model_name=model_name,
        api_key=api_key,
        sampling={"max_tokens": 256, **(sampling or {})},
        concurrency=16,
        max_exceptions=len(chosen) * group_size,
        limits=limits,
        sandboxes=1,
        python=python,
        jail=jail or JailConfig(),
        vocab_size=vocab_size,
        # A dry run serves the base model, so a script's art.rewards calls can be tried with it as judge.
        judge_model=model_name,
    )
    results = run_rollouts(request)
    trajectories = [{**t, "scenario_index": i} for i, group in enumerate(results) for t in group.trajectories]
    return {
        "trajectories": trajectories,
        "rewards": [t["reward"] for t in trajectories],
        "errors": [t["error"] for t in trajectories if t["error"]],
        "logs": [line for t in trajectories for line in t["logs"]],
        "duration_ms": int((time.monotonic() - started) * 1000),
    }


# --- the batch's files ---------------------------------------------------------------------------------


class _BatchFiles:
    """workroot/
    shared/          the jail's files: sandbox-<k>/ (script, reward, batch.json) and etc/
    sock/            the proxy's socket, the jail's only way out
    logs/            each sandbox process's output, outside every jail
    """

    def __init__(self, workroot: Path, n: int) -> None:
        self.root = workroot
        self.shared = workroot / "shared"
        self.logs = workroot / "logs"
        for d in (self.shared, self.logs, workroot / "sock"):
            d.mkdir(mode=0o700)
        self.n = n
        for k in range(n):  # empty until the batch is handed over; bound into the jail before that
            self.box(k).mkdir(mode=0o700)

    def box(self, k: int) -> Path:
        return self.shared / f"sandbox-{k}"

    def write(
        self, k: int, request: RolloutRequest, groups: list[int], reward_kind: str | None, *, concurrency: int
    ) -> None:
        d = self.box(k)
        (d / "rollout.py").write_text(request.script, encoding="utf-8")
        if request.reward is not None:
            (d / "reward.py").write_text(request.reward, encoding="utf-8")
        spec = {
            "groups": [{"index": g, "scenario": request.scenarios[g]} for g in groups],
            "group_size": request.group_size,
            "model_name": request.model_name,
            "reward_kind": reward_kind,
            "ruler": request.ruler,
            "judge_model": request.judge_model,
            "concurrency": concurrency,
            "rollout_timeout_s": request.limits.rollout_timeout_s,
            "max_processes": request.limits.max_processes,
            "record_bytes": request.limits.record_bytes,  # the guest replaces larger records, as the worker would
        }
        (d / "batch.json").write_text(json.dumps(spec))

    def write_scores(
        self, k: int, request: ScoreRequest, groups: list[int], reward_kind: str | None, *, concurrency: int
    ) -> None:
        """A score-mode sandbox's files: the reward function (if any) and its groups' stored trajectories."""
        d = self.box(k)
        if request.reward is not None:
            (d / "reward.py").write_text(request.reward, encoding="utf-8")
        spec = {
            "mode": "score",
            "groups": [
                {"index": g, "scenario": request.groups[g].scenario, "trajectories": request.groups[g].trajectories}
                for g in groups
            ],
            "model_name": request.judge_model or "none",
            "reward_kind": reward_kind,
            "ruler": request.ruler,
            "judge_model": request.judge_model,
            "concurrency": concurrency,
            "rollout_timeout_s": request.limits.rollout_timeout_s,
            "max_processes": request.limits.max_processes,
            "record_bytes": request.limits.record_bytes,  # the guest replaces larger records, as the worker would
        }
        (d / "batch.json").write_text(json.dumps(spec))

    def hand_over(self, uid: int) -> None:
        """The jail's files to the sandbox uid (bwrap runs as it); the logs stay the worker's."""
        self.root.chmod(0o711)  # bwrap must pass through; nobody may list it
        for path in (self.shared, *self.shared.rglob("*"), self.root / "sock"):
            os.chown(path, uid, uid)


# --- pre-started batches ------------------------------------------------------------------------------
#
# A sandbox process spends about a CPU-second before it can run anything: the interpreter, the SDK and the
# OpenAI client's import (pydantic models by the hundred; the .pyc files are already compiled, so a
# compiled-module cache would save nothing: the time is the modules' own code running). The jail itself
# costs tens of milliseconds. So every batch's processes are started in two halves: first the jail and
# the interpreter, which imports all that and waits on a pipe; then the hand-over, which writes the batch's
# files into its (already bound) directories, opens its proxy socket and sends the go with the batch's
# environment. A batch started cold does both at once (and imports only what its code imports). A run's
# step pre-starts the first half for its next batch once its update is done (prestart_batch), while the
# checkpoint is written and the inference server loads the new policy, which leave a core idle, at the
# lowest CPU priority; the hand-over restores normal priority before any user code is loaded. Not during
# the update: the batch's cgroup competes with the worker as a whole, whatever its processes' priority,
# and imports running beside an update on 2 cores made it 15-25 % slower.
#
# Isolation is that of a cold batch: a pre-started batch is a jail of its own (work root, uid, cgroup, pid,
# mount and network namespaces, scratch) built after the previous batch's jail was torn down, holds no user
# code or data until its hand-over, is handed to exactly one batch of the key (the run) it was started for,
# and is closed with that batch like any other. One that no batch takes (another shape, another worker
# took the run, the run ended) is killed and removed, at the latest after PRESTART_MAX_AGE_S.

PRESTART_MAX_AGE_S = 900.0  # an unused pre-started batch is discarded after this long
PRESTART_NICE = 19  # CPU priority of a pre-started jailed batch until its hand-over (in the idle class)
PRESTART_CAPACITY = 2  # pre-started batches one worker process holds at most (a GPU worker runs one run)


@dataclass(frozen=True)
class BatchShape:
    """What a batch's jail and processes are built from, none of it the batch's own content: a batch can only
    use processes started ahead of it when the shapes are equal."""

    sandboxes: int  # processes
    jail: JailConfig
    python: str  # the sandbox interpreter
    limits: SandboxLimits
    cpu_seconds: int  # CPU time per process (RLIMIT_CPU, set when it starts)

    @classmethod
    def of(cls, request: RolloutRequest | ScoreRequest, sandboxes: int, cpu_seconds: int) -> BatchShape:
        return cls(sandboxes, request.jail, request.python or sys.executable, request.limits, cpu_seconds)

    def jail_limits(self) -> JailLimits:
        return JailLimits(
            memory_mb=self.limits.memory_mb,
            processes=self.limits.max_processes + 32 * self.sandboxes,
            cpus=self.limits.cpus or float(self.sandboxes),
            scratch_mb=self.limits.scratch_mb,
        )


class _StartedBatch:
    """A batch's work root, jail and waiting sandbox processes. Handed over to one batch, then closed."""

    def __init__(self, shape: BatchShape, layout: _BatchFiles) -> None:
        self.shape = shape
        self.layout = layout
        self.jail: Jail | None = None
        self.boxes: list[_Sandbox] = []
        self.started_at = time.monotonic()
        self.expiry: threading.Timer | None = None
        self._closed = False

    @classmethod
    def start(
        cls, shape: BatchShape, *, prefix: str, box_type: type[_Sandbox] | None = None, ahead: bool = False
    ) -> _StartedBatch:
        """Raises JailUnavailable (before any process starts) when the jail cannot be built here."""
        batch = cls(shape, _BatchFiles(Path(tempfile.mkdtemp(prefix=prefix)), shape.sandboxes))
        try:
            if shape.jail.jailed:
                batch.jail = Jail(
                    config=shape.jail,
                    root=batch.layout.root,
                    socket_dir=batch.layout.root / "sock",
                    guest_dir=GUEST_DIR,
                    fallbacks_dir=FALLBACKS_DIR,
                    python=shape.python,
                    limits=shape.jail_limits(),
                )
                batch.layout.hand_over(batch.jail.uid)
            for k in range(shape.sandboxes):
                batch.boxes.append((box_type or _Sandbox).start(shape, batch.layout, k, batch.jail, ahead=ahead))
        except BaseException:
            batch.close()
            raise
        return batch

    def alive(self) -> bool:
        return not self._closed and all(box.proc.poll() is None for box in self.boxes)

    def hand_over(self, request: RolloutRequest | ScoreRequest) -> None:
        """The batch's files are written: hand them to the sandbox uid, restore normal CPU priority, and let
        each process run its groups."""
        if self.jail is not None:
            self.layout.hand_over(self.jail.uid)
            self.jail.renice(0)
        n = len(self.boxes)
        budget = ResultBudget(request.limits.batch_bytes)  # one for the batch, whichever process sends
        for k, box in enumerate(self.boxes):
            box.budget = budget
            box.begin(request, list(range(k, len(request.scenarios), n)), self.layout)

    def close(self) -> None:
        """Kill every process, remove the cgroup and every file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.expiry is not None:
            self.expiry.cancel()
        if self.jail is not None:
            self.jail.renice()  # a pre-started batch is of the idle class: killed so, it could take seconds to exit
        for box in self.boxes:
            box.cleanup()
        if self.jail is not None:
            self.jail.close()
        shutil.rmtree(self.layout.root, ignore_errors=True)


class PrestartedBatches:
    """The batches this process started ahead, at most one per key and `capacity` in all.

    add() starts the processes from the calling thread, add_soon() from this process's pre-starting thread,
    which lives as long as the process: the parent-death signal bwrap's --die-with-parent asks for is tied
    by the kernel to the thread that forked (prctl(2)), and a thread that never ends cannot fire it early.
    """

    def __init__(self, capacity: int = PRESTART_CAPACITY, max_age_s: float = PRESTART_MAX_AGE_S) -> None:
        self.capacity = capacity
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._by_key: dict[str, _StartedBatch] = {}
        self._pending: dict[str, threading.Event] = {}  # keys whose add_soon() has not finished
        self._jobs: queue.SimpleQueue | None = None
        self._starter_pid: int | None = None  # the process the pre-starting thread runs in

    def add_soon(self, key: str, shape: BatchShape) -> None:
        """add() on the pre-starting thread; returns at once (the fork and the jail's set-up, 0.1-0.2 s, are
        then off the caller's path). take() and discard() of the key wait for it."""
        done = threading.Event()
        with self._lock:
            if self._starter_pid != os.getpid():  # none yet, or a fork of the process that had it
                self._jobs = queue.SimpleQueue()
                threading.Thread(
                    target=self._start_loop, args=(self._jobs,), name="sandbox-prestart", daemon=True
                ).start()
                self._starter_pid = os.getpid()
            self._pending[key] = done
            self._jobs.put((key, shape, done))

    def _start_loop(self, jobs: queue.SimpleQueue) -> None:
        while True:
            key, shape, done = jobs.get()
            try:
                self.add(key, shape)
            finally:
                with self._lock:
                    if self._pending.get(key) is done:
                        del self._pending[key]
                done.set()

    def _wait_pending(self, key: str | None, timeout_s: float = 60.0) -> None:
        with self._lock:
            waiting = [done for k, done in self._pending.items() if key is None or k == key]
        for done in waiting:
            if not done.wait(timeout_s):
                logger.warning("the sandbox batch pre-started for %s took over %.0f s", key, timeout_s)

    def add(self, key: str, shape: BatchShape) -> None:
        """Pre-start a batch of `shape` for the key's next batch. A failure is logged, never raised: that
        batch then starts cold."""
        self._close(key)  # not discard(): add_soon() runs this while the key is pending
        try:
            batch = _StartedBatch.start(shape, prefix="artweb-batch-", ahead=True)
        except Exception:
            logger.warning("could not pre-start the next sandbox batch of %s", key, exc_info=True)
            return
        batch.expiry = threading.Timer(self.max_age_s, self._expire, args=(key, batch))
        batch.expiry.daemon = True
        batch.expiry.start()
        with self._lock:
            self._by_key[key] = batch
            oldest = sorted(self._by_key.items(), key=lambda item: item[1].started_at)
            dropped = [self._by_key.pop(k) for k, _ in oldest[: max(0, len(oldest) - self.capacity)]]
        for old in dropped:
            old.close()

    def take(self, key: str, shape: BatchShape) -> _StartedBatch | None:
        """The batch pre-started for `key`, if it has this shape and is still whole; it leaves the pool
        either way, so it is never offered twice."""
        self._wait_pending(key)
        with self._lock:
            batch = self._by_key.pop(key, None)
        if batch is None:
            return None
        if batch.shape == shape and batch.alive() and time.monotonic() - batch.started_at < self.max_age_s:
            if batch.expiry is not None:
                batch.expiry.cancel()
            return batch
        batch.close()
        return None

    def keys(self) -> list[str]:
        """The keys that hold a pre-started batch, once the add_soon() calls in progress are done."""
        self._wait_pending(None)
        with self._lock:
            return list(self._by_key)

    def discard(self, key: str | None = None) -> None:
        """Close the batch pre-started for `key` (None: all of them), once any add_soon() of it is done."""
        self._wait_pending(key)
        self._close(key)

    def _close(self, key: str | None) -> None:
        with self._lock:
            batches = [self._by_key.pop(k) for k in list(self._by_key) if key is None or k == key]
        for batch in batches:
            batch.close()

    def _expire(self, key: str, batch: _StartedBatch) -> None:
        with self._lock:
            if self._by_key.get(key) is not batch:
                return
            del self._by_key[key]
        batch.close()


prestarted = PrestartedBatches()
atexit.register(prestarted.discard)


# --- one sandbox process -----------------------------------------------------------------------------


def _unjailed_limits(limits: SandboxLimits, cpu_seconds: int) -> Callable[[], None]:
    """The development opt-out's only protection: rlimits on the one process (not its children)."""

    def apply() -> None:  # between fork and exec: setrlimit calls only
        mem = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb << 20, limits.file_mb << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


class _Sandbox:
    """One sandbox process: started first (it imports the SDK and waits), then given its part of a batch."""

    def __init__(
        self,
        proc: subprocess.Popen,
        read_fd: int,
        control_fd: int,
        log_path: Path,
        limits: SandboxLimits,
        cpu_seconds: int,
        jail: Jail | None,
    ) -> None:
        self.groups: list[int] = []  # set by begin()
        self.group_size = 0
        self.vocab_size: int | None = None
        self.proc = proc
        self.read_fd = read_fd
        self.control_fd = control_fd
        self.log_path = log_path
        self.limits = limits
        self.cpu_seconds = cpu_seconds
        self.jail = jail
        self.finished = False
        self.exit_reason: str | None = None
        self._buffer = b""
        self._ready: list[tuple[int, int, dict]] = []
        self._seen: set[tuple[int, int]] = set()
        self._done = False
        self.eof = False
        self.budget = ResultBudget(limits.batch_bytes)  # the batch's own, shared by its processes (hand_over)

    @classmethod
    def start(
        cls, shape: BatchShape, layout: _BatchFiles, k: int, jail: Jail | None, *, ahead: bool = False
    ) -> _Sandbox:
        """Start the process of layout.box(k); it waits for begin(). Started ahead of its batch, it imports the
        SDK and the OpenAI client meanwhile, at the lowest CPU priority (jailed: begin's hand-over restores it).
        The environment here is the same for every batch; what is the batch's own goes with begin()."""
        limits = shape.limits
        read_fd, write_fd = os.pipe()
        control_read, control_write = os.pipe()
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            # Each thread may otherwise reserve its own 64 MB malloc arena against the address-space limit.
            "MALLOC_ARENA_MAX": "2",
            "OMP_NUM_THREADS": "1",
            "USER": "sandbox",
            # The guest relays OPENAI_BASE_URL (127.0.0.1 in the jail) to this socket; the key is a dummy:
            # the proxy holds the real one.
            "ARTWEB_PROXY_SOCKET": "/run/artweb/inference.sock"
            if jail
            else str(layout.root / "sock" / "inference.sock"),
            "OPENAI_API_KEY": "artweb",
            "ARTWEB_RESULT_FD": str(write_fd),
            "ARTWEB_CONTROL_FD": str(control_read),
            "ARTWEB_WARM_UP": "1" if ahead else "0",
            # W&B and Weave would otherwise send crash reports to an outside service.
            "WANDB_ERROR_REPORTING": "false",
        }
        filter_fds: tuple[int, ...] = ()
        if jail is not None:
            env.update(HOME="/tmp", TMPDIR="/tmp")
            filter_fds = (filter_fd(),)  # the seccomp filter, read by this process's bwrap
            argv = jail.command(layout.box(k), [jail.python, *guest_python_args()], seccomp_fd=filter_fds[0])
            preexec = jail.preexec(
                cpu_seconds=shape.cpu_seconds, file_mb=limits.file_mb, nice=PRESTART_NICE if ahead else 0
            )
            cwd = "/"
        else:
            box = layout.box(k)
            env.update(HOME=str(box), TMPDIR=str(box))
            argv = [shape.python, "-I", "-u", "-X", "utf8", str(GUEST), str(box / "batch.json")]
            preexec = _unjailed_limits(limits, shape.cpu_seconds)
            cwd = str(box)
        log_path = layout.logs / f"sandbox-{k}.log"
        log = open(log_path, "wb")
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd, control_read, *filter_fds),
                start_new_session=True,
                preexec_fn=preexec,
            )
        except BaseException:
            for fd in (read_fd, control_write):
                os.close(fd)
            raise
        finally:
            for fd in (write_fd, control_read, *filter_fds):
                os.close(fd)
            log.close()
        os.set_blocking(read_fd, False)
        return cls(proc, read_fd, control_write, log_path, limits, shape.cpu_seconds, jail)

    def begin(self, request: RolloutRequest | ScoreRequest, groups: list[int], layout: _BatchFiles) -> None:
        """Tell the waiting process to run its groups (their files are in place), with the batch's environment."""
        self.groups = groups
        self.group_size = request.group_size
        self.vocab_size = request.vocab_size
        env = {
            "ARTWEB_SAMPLING": json.dumps(request.sampling),
            "ARTWEB_STEP": str(request.step),
            # art.rewards' default judge; the proxy admits it for this batch.
            "ARTWEB_JUDGE_MODEL": request.judge_model or "",
        }
        env.update({k: str(v) for k, v in request.env.items() if k in PASSED_ENV})
        if request.egress_hosts:
            # The guest relays a local port to this socket and names it as the HTTPS proxy (see open_egress).
            env["ARTWEB_EGRESS_SOCKET"] = (
                "/run/artweb/egress.sock" if self.jail else str(layout.root / "sock" / "egress.sock")
            )
        if "WEAVE_PROJECT" not in env:
            # A script calling weave.init() gets a disabled client at once instead of a network error.
            env["WEAVE_DISABLED"] = "true"
        view = memoryview((json.dumps({"env": env}) + "\n").encode())
        try:
            while view:
                view = view[os.write(self.control_fd, view) :]
        except OSError:  # it died while waiting: check_exit says how
            pass
        finally:
            os.close(self.control_fd)
            self.control_fd = -1

    # --- reading what the sandbox says (all of it is the user's word) --------------------------------
    # One reader for both modes: a rollout sandbox sends "trajectory" lines, a score sandbox "score" lines
    # (_ScoreSandbox says which slots it owns and how a score is checked); every cap is the worker's own.

    KINDS = ("trajectory", "done")  # the lines this sandbox may send
    WHAT = "trajectory"  # the key of a line's record, and what people read in the errors
    SLOT = "rollout it runs"  # what each of its records answers for

    def read(self) -> None:
        """Take what is waiting on the pipe, at most READ_CHUNK bytes: the caller's loop keeps its deadline."""
        if self.finished and self.exit_reason is not None:
            return
        try:
            chunk = os.read(self.read_fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.eof = True
            return
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        longest = max([len(self._buffer), *map(len, lines)])
        if longest > (limit := line_limit(self.limits.record_bytes)):
            self._violation(
                f"it sent a line of more than {megabytes(limit)}, twice the limit of "
                f"{megabytes(self.limits.record_bytes)} on one record (SandboxLimits.record_bytes)"
            )
            return
        for line in lines:
            try:
                self._accept(parse_line(line, self.KINDS, max_depth=self.limits.record_depth), len(line))
            except RecordError as exc:
                self._violation(str(exc))
                return

    def _accept(self, message: dict, size: int) -> None:
        """Take one parsed line of `size` bytes."""
        if self._done:
            raise RecordError(f"it kept writing after it said it was done ({self._records_allowed()})")
        if message["kind"] == "done":
            self._done = True
            return
        group, index = self._slot(message)
        if (group, index) in self._seen:
            raise RecordError(f"it sent {self.WHAT} {index} of group {group} twice ({self._records_allowed()})")
        self._seen.add((group, index))
        self._ready.append((group, index, self._keep(message.get(self.WHAT), size)))

    def _records_allowed(self) -> str:
        """The bound on the number of records, which the protocol's rules above enforce."""
        return f"it may send one {self.WHAT} per {self.SLOT}, then one done line: {self._expected() + 1} lines in all"

    def _slot(self, message: dict) -> tuple[int, int]:
        """(group, index) of the rollout a line is for, when it is one of this sandbox's; else RecordError."""
        group, index = message.get("group"), message.get("index")
        if group not in self.groups or isinstance(group, bool):
            raise RecordError(f"it sent a trajectory for group {group!r:.40}, which is not one of its groups")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < self.group_size:
            raise RecordError(f"it sent a trajectory with index {index!r:.40} outside its group")
        return group, index

    def _keep(self, value, size: int) -> dict:
        """What is kept for a rollout: its record once checked, or an error naming the limit it broke. `size`
        is its line's: the record as the guest wrote it, plus the line's few bytes around it."""
        if size > self.limits.record_bytes + RECORD_ENVELOPE_BYTES:
            return self._failed(
                f"The {self.WHAT} is {megabytes(size)} as JSON; the limit is {megabytes(self.limits.record_bytes)} "
                f"(SandboxLimits.record_bytes), so it was not kept. Keep long tool outputs, logs and metadata "
                "out of it."
            )
        try:
            record = self._check(value)
        except RecordError as exc:
            return self._failed(f"The sandbox sent an invalid {self.WHAT}: {exc}.")
        if not self.budget.take(size):
            return self._failed(
                f"The batch's results reached their limit of {megabytes(self.budget.limit)} together "
                f"(SandboxLimits.batch_bytes), so this {self.WHAT} ({megabytes(size)}) was not kept. Keep "
                "trajectories smaller, or run fewer rollouts a step."
            )
        return record

    def _check(self, value) -> dict:
        return check_trajectory(value, vocab_size=self.vocab_size)

    def _failed(self, error: str) -> dict:
        return failed_record(error)

    def _violation(self, why: str) -> None:
        self.kill(
            f"The sandbox running this rollout broke artweb's result protocol ({why}) and was stopped; "
            "its unfinished rollouts have no result. Write trajectories only by returning them from "
            "rollout()."
        )
        self._buffer = b""

    def take(self) -> list[tuple[int, int, dict]]:
        ready, self._ready = self._ready, []
        return ready

    # --- ending ------------------------------------------------------------------------------------

    def check_exit(self) -> None:
        if self.finished:
            return
        if not self._done:
            if self.proc.poll() is None:
                return
            # What is still in the pipe, a bounded amount at a time.
            for _ in range(64):
                if self.eof or self.finished:
                    break
                before = len(self._buffer), len(self._ready)
                self.read()
                if (len(self._buffer), len(self._ready)) == before and not self.eof:
                    break
            if self.finished:  # a protocol violation while draining
                return
        # Once it said "done" (its last line: one after it is a violation) every result is in, so a live
        # process is killed now rather than waited for: the interpreter's teardown, or a thread the
        # script left running, would hold the batch for nothing.
        if self._done and len(self._seen) < self._expected():  # user code wrote "done" itself
            self._violation("it said it was done before it sent every result")
            return
        self.finished = True
        if not self._done:
            self.exit_reason = self._describe_exit(self.proc.returncode)
        self._kill_group()

    def _expected(self) -> int:
        """Results this sandbox owes: one per rollout of its groups."""
        return len(self.groups) * self.group_size

    def kill(self, reason: str) -> None:
        if not self.finished:
            self._kill_group()
            self.finished = True
            self.exit_reason = reason

    def _describe_exit(self, code: int | None) -> str:
        if self.jail is not None and code is not None and code > 128 and code - 128 in signal.valid_signals():
            code = 128 - code  # bwrap exits with 128 + N when the jailed process died of signal N
        if self.jail is not None and self.jail.cgroup.oom_kills() > 0:
            why = (
                f"the batch reached its memory limit of {self.limits.memory_mb} MB (all its processes together) "
                "and the kernel killed a process"
            )
        elif code is not None and code < 0:
            sig = signal.Signals(-code)
            if sig == signal.SIGXCPU:
                why = f"it used its CPU time limit of {self.cpu_seconds} s"
            elif sig == signal.SIGXFSZ:
                why = f"it wrote a file or output past the {self.limits.file_mb} MB limit"
            elif sig == signal.SIGKILL:
                why = f"it was killed (SIGKILL), most often for memory (limit {self.limits.memory_mb} MB)"
            else:
                why = f"it was killed by {sig.name}"
        else:
            why = f"it exited with status {code} (os._exit(), or a crash outside a rollout)"
        tail = self._log_tail()
        return (
            "The sandbox process running this rollout stopped before the rollout finished: "
            + why
            + "."
            + (f"\n\nLast output of the sandbox process:\n{tail}" if tail else "")
        )

    def _log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - 16_000))
                text = fh.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])[-4000:]

    def _kill_group(self) -> None:
        # Unjailed: the session. Jailed: bwrap, whose death takes the namespace's init, and with it every
        # process of the namespace (--die-with-parent); the cgroup is swept when the batch ends.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def cleanup(self) -> None:
        self._kill_group()
        for fd in (self.read_fd, self.control_fd):
            try:
                os.close(fd)
            except OSError:
                pass


# --- score-only mode: stored trajectories scored again ------------------------------------------------


@dataclass
class ScoreGroup:
    scenario: dict
    trajectories: list[dict]  # stored records: messages, tools, metrics, metadata (as run_rollouts returned them)


@dataclass
class ScoreRequest:
    """Stored trajectories scored again in the jail: no rollout script, no policy. The reward function runs
    as it does in a step (reward(trajectory, scenario) per trajectory, or score_group(group, scenario) per
    group), or, with ruler, the judge scores each group side by side through the proxy.

    Carries the names _Sandbox.start reads from a RolloutRequest (limits, python, env …), so both modes
    start their processes the same way."""

    groups: list[ScoreGroup]
    reward: str | None = None  # the reward function's source; None with ruler
    ruler: bool = False
    judge_model: str | None = None  # the name the judge answers to at its upstream
    judge: Upstream | None = None  # where the proxy sends the judge's requests; the key stays outside
    concurrency: int = 16  # scores in flight across the batch (they matter for async rewards and RULER)
    limits: SandboxLimits = field(default_factory=SandboxLimits)  # rollout_timeout_s: per reward call
    sandboxes: int | None = None
    python: str | None = None
    jail: JailConfig = field(default_factory=JailConfig)
    step: int = 0
    sampling: dict = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    egress_hosts: tuple[str, ...] = ()
    vocab_size: int | None = None

    @property
    def scenarios(self) -> list[dict]:
        return [g.scenario for g in self.groups]

    @property
    def group_size(self) -> int:
        return max((len(g.trajectories) for g in self.groups), default=1)


def failed_score(error: str) -> dict:
    return {"reward": None, "metrics": {}, "error": error, "reward_ms": None}


def run_scores(request: ScoreRequest, should_stop: Callable[[], bool] = lambda: False) -> list[list[dict]]:
    """Score stored trajectories again in jailed sandbox processes; per group, per trajectory, in order:
    {"reward", "metrics", "error", "reward_ms"}.

    Every line the sandboxes send is checked (records.check_score); a sandbox that breaks the protocol
    (a score for a trajectory it was not given, twice the same one, garbage) is killed and every score it
    sent is void: its trajectories get the error instead. Raises Cancelled when should_stop() says so and
    JailUnavailable (before any user code runs) when the jail cannot be built here.
    """
    if request.ruler and not request.judge_model:
        raise ValueError("a batch scored by RULER needs a judge_model")
    if not request.ruler and request.reward is None:
        raise ValueError("a score batch needs a reward function or RULER")
    n_groups = len(request.groups)
    if n_groups == 0:
        return []
    limits = request.limits
    total = sum(len(g.trajectories) for g in request.groups)
    concurrency = max(1, request.concurrency)
    batch_timeout = limits.batch_timeout_s or (limits.rollout_timeout_s * (math.ceil(total / concurrency) + 1) + 60.0)
    reward_kind = None
    if request.reward is not None:
        reward_kind = validate_reward(request.reward)[0] or "trajectory"
    n_sandboxes = max(1, min(request.sandboxes or default_sandboxes(), n_groups))
    scores: list[list[dict | None]] = [[None] * len(g.trajectories) for g in request.groups]

    shape = BatchShape.of(request, n_sandboxes, limits.cpu_seconds or int(batch_timeout) + 10)
    started = _StartedBatch.start(shape, prefix="artweb-score-", box_type=_ScoreSandbox)
    layout, jail, sandboxes = started.layout, started.jail, started.boxes
    socket_path = layout.root / "sock" / "inference.sock"
    proxy = inference_proxy()
    selector = selectors.DefaultSelector()
    try:
        for k in range(n_sandboxes):
            layout.write_scores(
                k,
                request,
                list(range(k, n_groups, n_sandboxes)),
                reward_kind,
                concurrency=math.ceil(concurrency / n_sandboxes),
            )
        # Only the judge passes, and only under RULER; a reward function reaches no model.
        proxy.open(socket_path, {request.judge_model: request.judge} if request.ruler and request.judge else {})
        started.hand_over(request)
        for box in sandboxes:
            box.sizes = {g: len(request.groups[g].trajectories) for g in box.groups}
            selector.register(box.read_fd, selectors.EVENT_READ, box)

        def tick() -> None:
            for box in sandboxes:
                for group, index, score in box.take():
                    scores[group][index] = score

        _pump(
            sandboxes,
            selector,
            batch_timeout=batch_timeout,
            should_stop=should_stop,
            tick=tick,
            cancelled="the re-scoring was cancelled",
            unfinished="this trajectory was not scored.",
        )
        for box in sandboxes:
            for group, index, score in box.take():
                scores[group][index] = score
            if box.void:
                # A sandbox that broke the protocol may have forged any of its lines: none of them counts.
                for g in box.groups:
                    scores[g] = [None] * len(scores[g])
        reasons = {g: box.exit_reason for box in sandboxes for g in box.groups}
        note = ""
        if jail is not None and (kills := jail.cgroup.oom_kills()):
            note = (
                f"\n\nDuring this batch the kernel killed {kills} process(es) that went past the batch's "
                f"memory limit of {limits.memory_mb} MB."
            )
        return [
            [
                (s if s["error"] is None else {**s, "error": s["error"] + note})
                if s is not None
                else failed_score(reasons.get(g) or "The sandbox sent no score for this trajectory.")
                for s in group
            ]
            for g, group in enumerate(scores)
        ]
    finally:
        selector.close()
        started.close()
        proxy.close(socket_path)


class _ScoreSandbox(_Sandbox):
    """A sandbox in score mode: it answers for the trajectories of its own groups, each exactly once."""

    sizes: dict[int, int]
    void = False

    def _expected(self) -> int:
        return sum(self.sizes.values())

    KINDS = ("score", "done")
    WHAT = "score"
    SLOT = "trajectory it was given"

    def _slot(self, message: dict) -> tuple[int, int]:
        group, index = message.get("group"), message.get("index")
        if isinstance(group, bool) or group not in self.sizes:
            raise RecordError(f"it sent a score for group {group!r:.40}, which is not one of its groups")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < self.sizes[group]:
            raise RecordError(f"it sent a score for trajectory {index!r:.40} of group {group}, which it was not given")
        return group, index

    def _check(self, value) -> dict:
        return check_score(value)

    def _failed(self, error: str) -> dict:
        return failed_score(error)

    def _describe_exit(self, code: int | None) -> str:
        return (
            super()
            ._describe_exit(code)
            .replace(
                "running this rollout stopped before the rollout finished", "stopped before this trajectory was scored"
            )
        )

    def _violation(self, why: str) -> None:
        self.void = True
        self.kill(
            f"The sandbox scoring this trajectory broke artweb's result protocol ({why}) and was stopped; "
            "no score it sent counts. A reward function gives its score by returning it."
        )
        self._buffer = b""
