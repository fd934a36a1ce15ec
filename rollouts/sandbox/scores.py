"""Stored trajectories scored again in the jail: no rollout script, no policy. The batch is built as a
rollout batch is (rollouts.sandbox.batch, .prestart, .process) and read by the same reader
(rollouts.sandbox.reader); only what its processes send differs: one score per stored trajectory.
"""

from __future__ import annotations

import math
import selectors
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rollouts.sandbox.batch import BatchShape, SandboxLimits, default_sandboxes, inference_proxy, reward_kind
from rollouts.sandbox.jail import Jail, JailConfig
from rollouts.sandbox.prestart import StartedBatch
from rollouts.sandbox.process import Sandbox, pump
from rollouts.sandbox.proxy import Upstream
from rollouts.sandbox.records import RecordError, check_score


@dataclass
class ScoreGroup:
    scenario: dict
    trajectories: list[dict]  # stored records: messages, tools, metrics, metadata (as run_rollouts returned them)


@dataclass
class ScoreRequest:
    """Stored trajectories scored again in the jail: no rollout script, no policy. The reward function runs
    as it does in a step (reward(trajectory, scenario) per trajectory, or score_group(group, scenario) per
    group), or, with ruler, the judge scores each group side by side through the proxy.

    Carries the names Sandbox.start reads from a RolloutRequest (limits, python, env …), so both modes
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
    # The run's data attachments, name -> stored file: bound read-only at /data/<name> as in its steps, so a
    # reward that reads them scores the same way (rollouts.sandbox.attachments).
    attachments: dict[str, Path] = field(default_factory=dict)

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
    kind = reward_kind(request.reward)
    n_sandboxes = max(1, min(request.sandboxes or default_sandboxes(), n_groups))
    scores: list[list[dict | None]] = [[None] * len(g.trajectories) for g in request.groups]

    shape = BatchShape.of(request, n_sandboxes, limits.cpu_seconds or int(batch_timeout) + 10)
    started = StartedBatch.start(shape, prefix="artweb-score-", box_type=ScoreSandbox)
    layout, sandboxes = started.layout, started.boxes
    socket_path = layout.root / "sock" / "inference.sock"
    proxy = inference_proxy()
    selector = selectors.DefaultSelector()
    try:
        for k in range(n_sandboxes):
            groups = list(range(k, n_groups, n_sandboxes))
            layout.write_scores(k, request, groups, kind, concurrency=math.ceil(concurrency / n_sandboxes))
        # Only the judge passes, and only under RULER; a reward function reaches no model.
        proxy.open(socket_path, {request.judge_model: request.judge} if request.ruler and request.judge else {})
        started.hand_over(request)
        for box in sandboxes:
            box.sizes = {g: len(request.groups[g].trajectories) for g in box.groups}
            selector.register(box.read_fd, selectors.EVENT_READ, box)

        def tick() -> None:
            for box in sandboxes:
                _collect(box, scores)

        pump(
            sandboxes,
            selector,
            batch_timeout=batch_timeout,
            should_stop=should_stop,
            tick=tick,
            cancelled="the re-scoring was cancelled",
            unfinished="this trajectory was not scored.",
        )
        return _scores_out(scores, sandboxes, started.jail, limits.memory_mb)
    finally:
        selector.close()
        started.close()
        proxy.close(socket_path)


def _collect(box: ScoreSandbox, scores: list[list[dict | None]]) -> None:
    for group, index, score in box.take():
        scores[group][index] = score


def _scores_out(
    scores: list[list[dict | None]], sandboxes: list[ScoreSandbox], jail: Jail | None, memory_mb: int
) -> list[list[dict]]:
    """Every trajectory's score once the batch has ended: what its sandbox sent, or an error saying why not."""
    for box in sandboxes:
        _collect(box, scores)
        if box.void:
            # A sandbox that broke the protocol may have forged any of its lines: none of them counts.
            for g in box.groups:
                scores[g] = [None] * len(scores[g])
    reasons = {g: box.exit_reason for box in sandboxes for g in box.groups}
    note = ""
    if jail is not None and (kills := jail.cgroup.oom_kills()):
        note = (
            f"\n\nDuring this batch the kernel killed {kills} process(es) that went past the batch's "
            f"memory limit of {memory_mb} MB."
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


class ScoreSandbox(Sandbox):
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
