"""Run a person's rollout script and reward function on a batch of scenarios, never in this process.

Each batch is spread over a few sandbox processes (a group always stays within one); each process
runs its rollouts concurrently on asyncio (rollouts mostly wait on the inference server). A sandbox
process gets:

- a clean environment: the inference endpoint and nothing else (no secrets, database URL, settings);
- its own temporary working directory, and when artweb runs as root, the `nobody` user;
- resource limits: address space (memory), CPU seconds, processes (fork bombs), file size;
- a wall-clock limit per rollout (enforced inside the process) and one for the whole batch (here).

Results come back as one JSON line per finished trajectory on a pipe, so a process that dies (os._exit,
a segfault, a limit) loses only its unfinished rollouts, which are recorded as errors saying why.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pwd
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rollouts.runtime import Cancelled, TooManyErrors
from rollouts.runtime.validation import validate_reward

logger = logging.getLogger(__name__)

GUEST = Path(__file__).resolve().parent / "guest" / "_artweb_guest.py"


@dataclass(frozen=True)
class SandboxLimits:
    rollout_timeout_s: float = 120.0  # wall clock per rollout, reward included
    batch_timeout_s: float | None = None  # wall clock for the whole batch; None: from the rollout limit
    memory_mb: int = 2048  # address space per sandbox process (RLIMIT_AS)
    cpu_seconds: int | None = None  # CPU time per sandbox process; None: the batch timeout
    max_processes: int = 64  # processes and threads the sandbox may add (RLIMIT_NPROC)
    file_mb: int = 512  # largest file the sandbox may write (RLIMIT_FSIZE)
    user: str | None = "nobody"  # run as this user when artweb runs as root; None keeps the uid


@dataclass
class RolloutRequest:
    script: str  # the rollout script's source
    reward: str | None  # the reward function's source; None: the script sets trajectory.reward
    scenarios: list[dict]  # one group per scenario
    group_size: int
    base_url: str  # OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1
    model_name: str  # the served model or adapter name, e.g. "run-12@3"
    api_key: str = "artweb"
    sampling: dict = field(default_factory=dict)  # defaults for every chat completion request
    concurrency: int = 16  # rollouts in flight across the batch
    max_exceptions: int | float = 1.0  # failed rollouts tolerated: a count, or a fraction when < 1
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    sandboxes: int | None = None  # processes to spread the groups over; None: default_sandboxes()
    python: str | None = None  # interpreter for the sandbox (needs openai and httpx); None: this one
    step: int = 0  # exposed to scripts as model.get_step()
    env: dict[str, str] = field(default_factory=dict)  # observability settings; only PASSED_ENV keys pass


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

    def to_dict(self) -> dict:
        return {"scenario": self.scenario, "trajectories": self.trajectories}


def failed_record(error: str, duration_ms: int = 0) -> dict:
    return {"messages": [], "tools": None, "reward": None, "metrics": {}, "metadata": {}, "logs": [],
            "error": error, "duration_ms": duration_ms, "prompt_tokens": 0, "completion_tokens": 0}


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


def run_rollouts(
    request: RolloutRequest,
    should_stop: Callable[[], bool] = lambda: False,
    on_trajectory: Callable[[int, int, dict], None] | None = None,
) -> list[GroupResult]:
    """Run group_size rollouts per scenario in sandbox processes; one GroupResult per scenario, in order.

    should_stop is polled a few times a second; when it returns True the sandboxes are killed and
    Cancelled is raised. on_trajectory(group, index, record) is called as each trajectory arrives.
    Raises TooManyErrors as soon as more rollouts failed than max_exceptions allows.
    """
    if request.group_size < 1:
        raise ValueError("group_size must be at least 1")
    n_groups = len(request.scenarios)
    if n_groups == 0:
        return []
    limits = request.limits
    total = n_groups * request.group_size
    concurrency = max(1, request.concurrency)
    batch_timeout = limits.batch_timeout_s or (
        limits.rollout_timeout_s * math.ceil(total / concurrency) + 60.0
    )
    reward_kind = None
    if request.reward is not None:
        # An invalid reward file still runs: loading it fails in the sandbox, recorded on each rollout.
        reward_kind = validate_reward(request.reward)[0] or "trajectory"
    n_sandboxes = max(1, min(request.sandboxes or default_sandboxes(), n_groups))
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

    workroot = Path(tempfile.mkdtemp(prefix="artweb-sandbox-"))
    sandboxes: list[_Sandbox] = []
    selector = selectors.DefaultSelector()
    try:
        for k in range(n_sandboxes):
            box = _Sandbox.start(
                request, list(range(k, n_groups, n_sandboxes)), reward_kind, workroot / f"sandbox-{k}",
                concurrency=math.ceil(concurrency / n_sandboxes),
                cpu_seconds=limits.cpu_seconds or int(batch_timeout) + 10,
            )
            sandboxes.append(box)
            selector.register(box.read_fd, selectors.EVENT_READ, box)
        deadline = time.monotonic() + batch_timeout
        while any(not box.finished for box in sandboxes):
            if should_stop():
                raise Cancelled("the rollouts were cancelled")
            if time.monotonic() > deadline:
                for box in sandboxes:
                    box.kill(f"The batch did not finish within its {batch_timeout:g} s limit; "
                             "this rollout was stopped unfinished.")
                break
            for key, _ in selector.select(timeout=0.2):
                key.data.read()
                if key.data.eof:  # a closed pipe stays readable: stop watching it
                    selector.unregister(key.fd)
            for box in sandboxes:
                box.check_exit()
                collect(box)
            if len(failures) > budget:
                raise TooManyErrors(
                    f"{len(failures)} of {total} rollouts failed (max_exceptions={request.max_exceptions}). "
                    f"The first error:\n{failures[0]}",
                    _results(request, records, "Not run: the batch stopped after too many failures."),
                )
        for box in sandboxes:
            collect(box)
        return _results(request, records, None, sandboxes)
    finally:
        selector.close()
        for box in sandboxes:
            box.cleanup()
        shutil.rmtree(workroot, ignore_errors=True)


def _results(request, records, missing: str | None, sandboxes=()) -> list[GroupResult]:
    reasons = {g: box.exit_reason for box in sandboxes for g in box.groups}
    return [
        GroupResult(
            scenario=scenario,
            trajectories=[r if r is not None else failed_record(missing or reasons.get(g) or "The rollout produced "
                                                                "no result.") for r in records[g]],
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
    api_key: str = "artweb",
    sampling: dict | None = None,
    max_scenarios: int = 3,
    group_size: int = 1,
    timeout_s: float = 90.0,
    python: str | None = None,
) -> dict:
    """Try a script on a few scenarios; returns within about timeout_s, with output or errors.

    The result is JSON: {"trajectories": [record + "scenario_index"], "rewards", "errors", "logs",
    "duration_ms"}. Nothing here raises for a broken script: its errors are in the result.
    """
    started = time.monotonic()
    chosen = list(scenarios[:max_scenarios])
    limits = SandboxLimits(rollout_timeout_s=max(1.0, timeout_s - 10), batch_timeout_s=timeout_s)
    request = RolloutRequest(
        script=script, reward=reward, scenarios=chosen, group_size=group_size, base_url=base_url,
        model_name=model_name, api_key=api_key, sampling={"max_tokens": 256, **(sampling or {})},
        concurrency=16, max_exceptions=len(chosen) * group_size, limits=limits, sandboxes=1, python=python,
    )
    results = run_rollouts(request)
    trajectories = [
        {**t, "scenario_index": i} for i, group in enumerate(results) for t in group.trajectories
    ]
    return {
        "trajectories": trajectories,
        "rewards": [t["reward"] for t in trajectories],
        "errors": [t["error"] for t in trajectories if t["error"]],
        "logs": [line for t in trajectories for line in t["logs"]],
        "duration_ms": int((time.monotonic() - started) * 1000),
    }


# --- one sandbox process -----------------------------------------------------------------------------


_usable_users: dict[tuple[str, str], bool] = {}


def _sandbox_user(name: str | None, python: str) -> pwd.struct_passwd | None:
    """The user to run sandboxes as: `name` when we are root and it can run the interpreter.

    A virtualenv under a private home directory (mode 0700) cannot be executed by another user; then
    the sandbox keeps our uid, and a warning says so once.
    """
    if name is None or os.geteuid() != 0:
        return None
    try:
        user = pwd.getpwnam(name)
    except KeyError:
        return None
    key = (name, python)
    if key not in _usable_users:
        try:
            probe = subprocess.run([python, "-I", "-c", "import openai, httpx"], user=user.pw_uid, group=user.pw_gid,
                                   extra_groups=[], cwd="/", capture_output=True, timeout=120, check=False)
            _usable_users[key] = probe.returncode == 0
        except (OSError, subprocess.SubprocessError):
            _usable_users[key] = False
        if not _usable_users[key]:
            logger.warning("sandboxes run as %s: user %r cannot run %s (install the environment where "
                           "that user can read it)", pwd.getpwuid(os.getuid()).pw_name, name, python)
    return user if _usable_users[key] else None


def _tasks_of(uid: int) -> int:
    """Processes and threads uid runs now: RLIMIT_NPROC counts them all, so the budget goes on top."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid == uid:
                count += len(os.listdir(f"/proc/{entry.name}/task"))
        except OSError:
            continue
    return count


def _limiter(limits: SandboxLimits, cpu_seconds: int, nproc: int) -> Callable[[], None]:
    def apply() -> None:  # runs in the child between fork and exec, already as the sandbox user
        mem = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb << 20, limits.file_mb << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


class _Sandbox:
    def __init__(self, groups: list[int], proc: subprocess.Popen, read_fd: int, workdir: Path, limits, cpu_seconds):
        self.groups = groups
        self.proc = proc
        self.read_fd = read_fd
        self.workdir = workdir
        self.limits = limits
        self.cpu_seconds = cpu_seconds
        self.finished = False
        self.exit_reason: str | None = None
        self._buffer = b""
        self._ready: list[tuple[int, int, dict]] = []
        self._done = False
        self.eof = False

    @classmethod
    def start(cls, request: RolloutRequest, groups: list[int], reward_kind: str | None, workdir: Path, *,
              concurrency: int, cpu_seconds: int) -> _Sandbox:
        limits = request.limits
        workdir.mkdir(parents=True)
        (workdir / "rollout.py").write_text(request.script, encoding="utf-8")
        if request.reward is not None:
            (workdir / "reward.py").write_text(request.reward, encoding="utf-8")
        read_fd, write_fd = os.pipe()
        spec = {
            "groups": [{"index": g, "scenario": request.scenarios[g]} for g in groups],
            "group_size": request.group_size,
            "model_name": request.model_name,
            "reward_kind": reward_kind,
            "concurrency": concurrency,
            "rollout_timeout_s": limits.rollout_timeout_s,
            "result_fd": write_fd,
            "max_processes": limits.max_processes,
        }
        (workdir / "batch.json").write_text(json.dumps(spec))
        python = request.python or sys.executable
        user = _sandbox_user(limits.user, python)
        uid = user.pw_uid if user else os.getuid()
        if user:
            workdir.parent.chmod(0o755)
            for path in (workdir, *workdir.iterdir()):
                os.chown(path, user.pw_uid, user.pw_gid)
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(workdir),
            "TMPDIR": str(workdir),
            "LANG": "C.UTF-8",
            # Each thread may otherwise reserve its own 64 MB malloc arena against the address-space limit.
            "MALLOC_ARENA_MAX": "2",
            "OMP_NUM_THREADS": "1",
            "OPENAI_BASE_URL": request.base_url,
            "OPENAI_API_KEY": request.api_key,
            "ARTWEB_SAMPLING": json.dumps(request.sampling),
            "ARTWEB_STEP": str(request.step),
            # W&B and Weave would otherwise send crash reports to an outside service.
            "WANDB_ERROR_REPORTING": "false",
        }
        env.update({k: str(v) for k, v in request.env.items() if k in PASSED_ENV})
        if "WEAVE_PROJECT" not in env:
            # A script calling weave.init() gets a disabled client at once instead of a network error.
            env["WEAVE_DISABLED"] = "true"
        log = open(workdir / "sandbox.log", "wb")  # noqa: SIM115 - handed to the child, closed below
        try:
            proc = subprocess.Popen(
                # -I: ignore PYTHON* variables and user site-packages; -u: unbuffered; -X utf8: UTF-8 I/O.
                [python, "-I", "-u", "-X", "utf8", str(GUEST), str(workdir / "batch.json")],
                cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=(write_fd,), start_new_session=True,
                user=user.pw_uid if user else None, group=user.pw_gid if user else None,
                extra_groups=[] if user else None,
                # Only setrlimit calls run between fork and exec: no locks or imports that a thread
                # of the caller could hold at fork time.
                preexec_fn=_limiter(  # noqa: PLW1509
                    limits, cpu_seconds, _tasks_of(uid) + limits.max_processes),
            )
        finally:
            os.close(write_fd)
            log.close()
        os.set_blocking(read_fd, False)
        return cls(groups, proc, read_fd, workdir, limits, cpu_seconds)

    def read(self) -> None:
        while True:
            try:
                chunk = os.read(self.read_fd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                self.eof = True
                return
            self._buffer += chunk
            *lines, self._buffer = self._buffer.split(b"\n")
            for line in lines:
                message = json.loads(line)
                if message["kind"] == "trajectory":
                    self._ready.append((message["group"], message["index"], message["trajectory"]))
                elif message["kind"] == "done":
                    self._done = True

    def take(self) -> list[tuple[int, int, dict]]:
        ready, self._ready = self._ready, []
        return ready

    def check_exit(self) -> None:
        if self.finished:
            return
        code = self.proc.poll()
        if code is None and not self._done:
            return
        if code is None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.read()
        self.finished = True
        if not self._done:
            self.exit_reason = self._describe_exit(self.proc.returncode)
        self._kill_group()

    def kill(self, reason: str) -> None:
        if not self.finished:
            self._kill_group()
            self.read()
            self.finished = True
            self.exit_reason = reason

    def _describe_exit(self, code: int | None) -> str:
        if code is not None and code < 0:
            sig = signal.Signals(-code)
            if sig == signal.SIGXCPU:
                why = f"it used its CPU time limit of {self.cpu_seconds} s"
            elif sig == signal.SIGKILL:
                why = f"it was killed (SIGKILL), most often for memory (limit {self.limits.memory_mb} MB)"
            else:
                why = f"it was killed by {sig.name}"
        else:
            why = f"it exited with status {code} (os._exit(), or a crash outside a rollout)"
        tail = self._log_tail()
        return ("The sandbox process running this rollout stopped before the rollout finished: " + why + "."
                + (f"\n\nLast output of the sandbox process:\n{tail}" if tail else ""))

    def _log_tail(self, lines: int = 20) -> str:
        try:
            text = (self.workdir / "sandbox.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])[-4000:]

    def _kill_group(self) -> None:
        # The whole session: children the script forked die with it.
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
        try:
            os.close(self.read_fd)
        except OSError:
            pass
