"""Run a person's rollout script and reward function on a batch of scenarios, never in this process.

Each batch is spread over a few sandbox processes (a group always stays within one); each process
runs its rollouts concurrently on asyncio (rollouts mostly wait on the inference server). The batch
runs in a jail (rollouts.sandbox.jail): its own user, pid, mount, ipc, uts and network namespaces, an
unprivileged uid, a read-only view of the interpreter, the SDK and its own files, a private /tmp, and
cgroup limits on memory, processes and CPU for the whole batch. Its only way out is one unix socket
to the worker's inference proxy (rollouts.sandbox.proxy), which passes the OpenAI inference routes for
the batch's own model name (and its RULER judge's) and nothing else; the guest relays 127.0.0.1 inside
the jail to it, so OPENAI_BASE_URL works for any client.

Results come back as one JSON line per finished trajectory on a pipe, so a process that dies (os._exit,
a segfault, a limit) loses only its unfinished rollouts, which are recorded as errors saying why. Every
line is checked (rollouts.sandbox.reader) before it is believed; a sandbox that breaks the protocol
(garbage, a flood, a record for a rollout it does not own) is killed and its unfinished rollouts fail.
A batch that reaches its deadline keeps every result that came back; each rollout still unfinished gets
an error naming it, every other rollout the deadline stopped, and the last lines it printed
(deadline_error), and its sandbox is killed at the deadline itself (rollouts.sandbox.process.pump).

A run's next batch can be started ahead, once its step's update is done: a fresh jail whose interpreter has imported
the SDK and the OpenAI client and waits for the batch; why this design, and why it keeps each batch as
isolated as a cold one, is in rollouts.sandbox.prestart.
"""

from __future__ import annotations

import math
import selectors
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rollouts.sandbox import TooManyErrors
from rollouts.sandbox.batch import (
    BatchFiles,
    BatchShape,
    SandboxLimits,
    default_sandboxes,
    failed_record,
    inference_proxy,
    reward_kind,
)
from rollouts.sandbox.bundles import BundleLimits
from rollouts.sandbox.egress import EgressPolicy
from rollouts.sandbox.jail import JailConfig
from rollouts.sandbox.prestart import StartedBatch, prestarted
from rollouts.sandbox.process import Sandbox, pump
from rollouts.sandbox.proxy import Upstream
from rollouts.sandbox.records import DEADLINE_PREFIX
from rollouts.sandbox.tools import connection_lines, scrubbed


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
    # The run's secrets, name -> value (rollouts.sandbox.tools): environment variables of this batch's processes
    # only, scrubbed from every result. Never in repr: a request in an error or a log shows none of them.
    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    # Called once the batch's tunnel is closed with its connections (rollouts.sandbox.tunnel.connect_serve).
    on_egress: Callable[[list[dict]], None] | None = None
    # The judge for RULER: model_name or a key of extra_models. Scripts get it as art.rewards' default judge.
    judge_model: str | None = None
    ruler: bool = False  # the judge scores every group after its rollouts; its scores become the rewards
    # The batches of one run: a batch takes the jail pre-started for its key (when it has the batch's shape),
    # and, with prestart_next, pre-starts one for the key's next batch (see rollouts.sandbox.prestart).
    warm_key: str | None = None
    prestart_next: bool = False
    # How errors name each scenario: its number in its set (the inspector's Scenario #); None: its position here.
    scenario_numbers: list[int] | None = None
    # The script's stored bundle (rollouts.sandbox.bundles): its other files go beside rollout.py; None: a plain script.
    bundle: Path | None = None
    bundle_limits: BundleLimits = field(default_factory=BundleLimits)  # checked again before it is unpacked
    # The run's data attachments, name -> stored file: each bound read-only at /data/<name> when the jail is
    # built (rollouts.sandbox.attachments), so they are part of the batch's shape.
    attachments: dict[str, Path] = field(default_factory=dict)


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


def _exceptions_budget(max_exceptions: float, total: int) -> float:
    if isinstance(max_exceptions, float) and max_exceptions < 1:
        return max_exceptions * total
    return float(max_exceptions)


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
    rollouts.sandbox.prestart), and, with prestart_next, pre-starts one for the key's next batch once it
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
    try:
        results = _rollouts_in(
            started or StartedBatch.start(shape, prefix="artweb-batch-"),
            request,
            batch_timeout,
            should_stop,
            on_trajectory,
        )
    except TooManyErrors as exc:
        if not request.secrets:
            raise
        secrets = request.secrets.values()
        raise TooManyErrors(scrubbed(str(exc), secrets), scrubbed_groups(exc.groups, secrets)) from None
    results = scrubbed_groups(results, request.secrets.values())
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
    started: StartedBatch,
    request: RolloutRequest,
    batch_timeout: float,
    should_stop: Callable[[], bool],
    on_trajectory: Callable[[int, int, dict], None] | None,
) -> list[GroupResult]:
    """The batch, in the jail and processes `started` (closed when it ends, whatever happens)."""
    total = len(request.scenarios) * request.group_size
    layout, jail, sandboxes = started.layout, started.jail, started.boxes
    records: list[list[dict | None]] = [[None] * request.group_size for _ in request.scenarios]
    budget = _exceptions_budget(request.max_exceptions, total)
    failures: list[str] = []

    def collect(box: Sandbox) -> None:
        for group, index, record in box.take():
            record = scrubbed(record, request.secrets.values())
            records[group][index] = record
            if record["error"] is not None:
                failures.append(record["error"])
            if on_trajectory is not None:
                on_trajectory(group, index, record)

    socket_path = layout.root / "sock" / "inference.sock"
    egress_path = socket_path.with_name("egress.sock")
    connections: list[dict] = []  # the tunnel's, appended on the proxy's thread
    proxy = inference_proxy()
    selector = selectors.DefaultSelector()
    try:
        _write_files(layout, request, len(sandboxes))
        proxy.open(
            socket_path, {request.model_name: Upstream(request.base_url, request.api_key), **request.extra_models}
        )
        if request.egress_hosts:
            proxy.open_egress(egress_path, request.egress_hosts, request.egress_policy, connections.append)
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

        pump(
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
        stopped = _deadline_records(request, records, sandboxes, batch_timeout)
        if jail is not None and (kills := jail.cgroup.oom_kills()):
            _note_memory(records, kills, request.limits.memory_mb)
        results = _results(request, records, None, sandboxes)
        failed = sum(1 for group in results for t in group.trajectories if t["error"])
        if stopped and failed > budget:
            raise TooManyErrors(
                f"{failed} of {total} rollouts failed (max_exceptions={request.max_exceptions}). The first "
                f"rollout the deadline stopped:\n{stopped}",
                results,
            )
        return results
    finally:
        selector.close()
        started.close()
        proxy.close(socket_path)
        if request.egress_hosts:
            proxy.close(egress_path)  # its processes are gone: every connection is recorded once this returns
            # Also for a batch that stopped early: the records are the ones the results (or the error) hold.
            _note_connections(records, connections, request.on_egress)


def _note_connections(records, connections: list[dict], on_egress) -> None:
    """Each finished rollout's logs list the batch's tunnel connections (see connection_lines for why all of
    them); on_egress gets them for the run's timeline."""
    lines = connection_lines(list(connections))
    for group in records:
        for record in group:
            if record is not None:
                record["logs"] = [*record.get("logs", []), *lines]
    if on_egress is not None:
        on_egress(list(connections))


def scrubbed_groups(groups: list[GroupResult], secrets) -> list[GroupResult]:
    """The groups with every secret's value scrubbed from their trajectories (rollouts.sandbox.tools.scrubbed)."""
    if not any(secrets):
        return groups
    return [GroupResult(g.scenario, scrubbed(g.trajectories, secrets)) for g in groups]


def _write_files(layout: BatchFiles, request: RolloutRequest, n_sandboxes: int) -> None:
    """Each process's part of the batch: every n-th group, its share of the concurrency, the user's code."""
    n_groups = len(request.scenarios)
    kind = reward_kind(request.reward)
    for k in range(n_sandboxes):
        groups = list(range(k, n_groups, n_sandboxes))
        layout.write(k, request, groups, kind, concurrency=math.ceil(max(1, request.concurrency) / n_sandboxes))


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


MAX_NAMED = 8  # rollouts a deadline error names; the others are counted
ERROR_LOG_LINES = 5  # of a stopped rollout's last lines, those its error quotes (its logs keep the rest)


def _deadline_records(request: RolloutRequest, records, sandboxes, batch_timeout: float) -> str | None:
    """Give each rollout that a sandbox stopped by the deadline left without a result its error and the last
    lines it printed (from the sandbox's report, when it could give one). Returns the first such error."""
    stopped = [
        (g, i, box)
        for box in sandboxes
        if box.at_deadline or (box.reports and box.exit_reason is None)  # (killed, or it answered the report)
        for g in box.groups
        for i in range(request.group_size)
        if records[g][i] is None
    ]
    if not stopped:
        return None
    label = _labeler(request)
    names = [label(g, i) for g, i, _ in stopped]
    for g, i, box in stopped:
        report = box.reports.get((g, i))
        error = deadline_error(
            names,
            this=label(g, i),
            limit_s=batch_timeout,
            rollout_timeout_s=request.limits.rollout_timeout_s,
            report=report,
            process_output=box.log_tail(lines=10)[-1000:],
        )
        kept = (report or {}).get("record") or {**failed_record(""), "logs": report["logs"] if report else []}
        records[g][i] = {**kept, "reward": None, "error": error}
    g, i, _ = stopped[0]
    return records[g][i]["error"]


def _labeler(request: RolloutRequest) -> Callable[[int, int], str]:
    numbers = request.scenario_numbers or list(range(len(request.scenarios)))
    if request.group_size == 1:
        return lambda g, i: f"scenario {numbers[g]}"
    return lambda g, i: f"scenario {numbers[g]} sample {i}"


STATES = {
    "waiting": "had not started (held back by the batch's concurrency, or by a rollout that kept its process busy)",
    "running": "was still running",
    "scoring": "had finished but was not scored: its group's reward (score_group or RULER) runs once all "
    "the group's rollouts have",
}


def deadline_error(
    names: list[str],
    *,
    this: str,
    limit_s: float,
    rollout_timeout_s: float,
    report: dict | None,
    process_output: str,
) -> str:
    """The error of a rollout still unfinished at its batch's deadline: every rollout the deadline stopped
    (MAX_NAMED of them by name), where this one was and the last lines it printed, and what to fix."""
    named = ", ".join(names[:MAX_NAMED]) + (f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else "")
    stopped = "1 rollout" if len(names) == 1 else f"{len(names)} rollouts"
    parts = [f"{DEADLINE_PREFIX}{limit_s:g} s limit, so it was stopped with {stopped} unfinished: {named}."]
    if report is None:
        parts.append(
            f"This one ({this}) had sent no result, and its sandbox process gave no report of it before the "
            "deadline, so what it printed last is not known."
        )
    else:
        ran = f" after {report['seconds']:.1f} s" if report["seconds"] is not None else ""
        said = report["logs"][-ERROR_LOG_LINES:]
        printed = (
            "The last lines it printed:\n" + "\n".join(line[:300] for line in said) if said else "It printed nothing."
        )
        where = f"This one ({this}) {STATES[report['state']]}{ran}."
        parts.append(where if report["state"] == "waiting" else f"{where} {printed}")
    if process_output:
        parts.append(f"Last output of its sandbox process, outside any rollout:\n{process_output}")
    parts.append(
        f"Each rollout is stopped at its own limit of {rollout_timeout_s:g} s (rollout_timeout_s); one that "
        "outlives it blocks in code that cannot be interrupted, or catches the timeout (except BaseException, "
        "or asyncio.CancelledError) and carries on. Give blocking calls their own timeout."
    )
    return "\n\n".join(parts)


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
    bundle: Path | None = None,
    bundle_limits: BundleLimits | None = None,
    attachments: dict[str, Path] | None = None,
) -> dict:
    """Try a script on a few scenarios; returns within about timeout_s, with output or errors.

    attachments: name -> stored file, each bound read-only at /data/<name> as in a run's batches.

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
        bundle=bundle,
        bundle_limits=bundle_limits or BundleLimits(),
        attachments=attachments or {},
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
