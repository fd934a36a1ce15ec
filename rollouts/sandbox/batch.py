"""What every batch of the sandbox is built from, in both modes (rollouts, rollouts.sandbox.rollouts; scores
again, rollouts.sandbox.scores): its limits, its shape (what its jail and processes are started from),
its files, and this process's inference proxy, the jail's only way out.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rollouts.sandbox.attachments import DATA_INSIDE, attachment_name_problem
from rollouts.sandbox.bundles import ROLLOUT, Bundle, BundleLimits, bundle_read, bundle_write
from rollouts.sandbox.jail import JailConfig, JailLimits
from rollouts.sandbox.mounts import GUEST_DIR
from rollouts.sandbox.proxy import InferenceProxy
from rollouts.sandbox.validation import validate_reward

if TYPE_CHECKING:
    from rollouts.sandbox.rollouts import RolloutRequest
    from rollouts.sandbox.scores import ScoreRequest

GUEST = GUEST_DIR / "_artweb_guest.py"  # the guest program, run by every sandbox process


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
    # What the batch may send back, enforced by the worker on every line it reads (rollouts.sandbox.records):
    # user code shares the guest's process and can write to the result pipe itself. Records are at most one
    # per rollout, then a "done" line per sandbox process: the protocol refuses any other.
    record_bytes: int = 4 << 20  # one trajectory or score as JSON, as the guest is told; a larger one fails
    record_depth: int = 100  # nesting levels of a result line, checked before parsing; deeper stops the sandbox
    batch_bytes: int = 256 << 20  # the batch's records together; one that no longer fits fails its rollout


# What a run's observability settings may put in the sandbox's environment (Weave tracing); nothing else
# from the caller's environment ever reaches user code.
PASSED_ENV = ("WEAVE_PROJECT", "WANDB_API_KEY", "WANDB_BASE_URL", "WF_TRACE_SERVER_URL", "WANDB_MODE", "WANDB_DIR")


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


def reward_kind(reward: str | None) -> str | None:
    """How the guest calls the reward function: per "trajectory" or per "group"; None without one. An invalid
    file still runs: loading it fails in the sandbox, recorded on each rollout (or score)."""
    if reward is None:
        return None
    return validate_reward(reward)[0] or "trajectory"


@dataclass(frozen=True)
class BatchShape:
    """What a batch's jail and processes are built from, none of it the batch's own content: a batch can only
    use processes started ahead of it when the shapes are equal."""

    sandboxes: int  # processes
    jail: JailConfig
    python: str  # the sandbox interpreter
    limits: SandboxLimits
    cpu_seconds: int  # CPU time per process (RLIMIT_CPU, set when it starts)
    # (name, host file) of each data attachment, bound when the jail is built at DATA_INSIDE/<name>: a run's
    # own files, the same for each of its batches (rollouts.sandbox.attachments).
    attachments: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, request: RolloutRequest | ScoreRequest, sandboxes: int, cpu_seconds: int) -> BatchShape:
        attachments = tuple(sorted((name, str(path)) for name, path in request.attachments.items()))
        for name, _ in attachments:
            if problem := attachment_name_problem(name):
                raise ValueError(problem)
        return cls(sandboxes, request.jail, request.python or sys.executable, request.limits, cpu_seconds, attachments)

    def attachment_files(self) -> dict[str, str]:
        """Host file -> its path in the jail."""
        return {host: f"{DATA_INSIDE}/{name}" for name, host in self.attachments}

    def jail_limits(self) -> JailLimits:
        return JailLimits(
            memory_mb=self.limits.memory_mb,
            processes=self.limits.max_processes + 32 * self.sandboxes,
            cpus=self.limits.cpus or float(self.sandboxes),
            scratch_mb=self.limits.scratch_mb,
        )


class BatchFiles:
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
        self._bundle: tuple[Path, Bundle] | None = None  # the batch's bundle, read and checked once
        for k in range(n):  # empty until the batch is handed over; bound into the jail before that
            self.box(k).mkdir(mode=0o700)

    def box(self, k: int) -> Path:
        return self.shared / f"sandbox-{k}"

    @property
    def attachments_dir(self) -> Path:
        """Without the jail (the development opt-out): where the batch's attachments are linked by name."""
        return self.root / "data"

    def link_attachments(self, attachments: tuple[tuple[str, str], ...]) -> None:
        """The development opt-out's DATA_INSIDE: links to the files, as the worker's own user may read them."""
        self.attachments_dir.mkdir(mode=0o700)
        for name, host in attachments:
            (self.attachments_dir / name).symlink_to(host)

    def write(
        self, k: int, request: RolloutRequest, groups: list[int], reward_kind: str | None, *, concurrency: int
    ) -> None:
        d = self.box(k)
        if request.bundle is not None:
            self._write_bundle(d, request.bundle, request.bundle_limits)
        (d / "rollout.py").write_text(request.script, encoding="utf-8")
        spec = {
            "groups": [{"index": g, "scenario": request.scenarios[g]} for g in groups],
            "group_size": request.group_size,
            "model_name": request.model_name,
        }
        self._write_spec(d, request, spec, reward_kind, concurrency)

    def _write_bundle(self, d: Path, path: Path, limits: BundleLimits) -> None:
        """The bundle's files beside rollout.py (the request's script, which is the bundle's own). The stored
        zip was checked on upload; it is checked again here, once per batch, before a file is written."""
        if self._bundle is None or self._bundle[0] != path:
            self._bundle = (path, bundle_read(path.read_bytes(), limits))
        bundle_write(self._bundle[1], d, skip=frozenset({ROLLOUT}))

    def write_scores(
        self, k: int, request: ScoreRequest, groups: list[int], reward_kind: str | None, *, concurrency: int
    ) -> None:
        """A score-mode sandbox's files: the reward function (if any) and its groups' stored trajectories."""
        spec = {
            "mode": "score",
            "groups": [
                {"index": g, "scenario": request.groups[g].scenario, "trajectories": request.groups[g].trajectories}
                for g in groups
            ],
            "model_name": request.judge_model or "none",
        }
        self._write_spec(self.box(k), request, spec, reward_kind, concurrency)

    @staticmethod
    def _write_spec(d: Path, request, spec: dict, reward_kind: str | None, concurrency: int) -> None:
        """The reward function (if any) and batch.json: `spec` with what both modes pass the guest."""
        if request.reward is not None:
            (d / "reward.py").write_text(request.reward, encoding="utf-8")
        spec |= {
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
