"""One sandbox process, as the worker drives it: started first (it imports the SDK and waits), then given
its part of a batch, read (rollouts.sandbox.reader) until it is done, and ended, saying why when it
stopped early. And the loop that reads a batch's processes until every one has finished.

A batch's deadline is kept to the moment: a little before it, each process still running is asked to
report (a line on its control pipe: the guest answers for each rollout it has not sent, with a result when
it has one, else with an "unfinished" line of where it was and what it printed last); at the deadline every
process left is killed, what it had already written to its pipe is still read, and the worker goes on.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rollouts.sandbox import Cancelled
from rollouts.sandbox.attachments import DATA_INSIDE
from rollouts.sandbox.batch import GUEST, PASSED_ENV, BatchFiles, BatchShape, SandboxLimits
from rollouts.sandbox.jail import Jail, guest_python_args
from rollouts.sandbox.reader import ResultReader
from rollouts.sandbox.seccomp import filter_fd
from rollouts.sandbox.tools import secret_name_problem

if TYPE_CHECKING:
    from rollouts.sandbox.rollouts import RolloutRequest
    from rollouts.sandbox.scores import ScoreRequest

PRESTART_NICE = 19  # CPU priority of a pre-started jailed batch until its hand-over (in the idle class)
REPORT_GRACE_S = 2.0  # how long before the deadline a sandbox is asked to report (at most a quarter of the limit)
DRAIN_READS = 64  # reads of a stopped sandbox's pipe, at most READ_CHUNK each: what it wrote before it stopped


def report_grace(batch_timeout: float) -> float:
    return min(REPORT_GRACE_S, batch_timeout / 4)


def pump(sandboxes, selector, *, batch_timeout: float, should_stop, tick, cancelled: str, unfinished: str) -> None:
    """Read the sandboxes' pipes until every one has finished, the batch's deadline passes or the caller
    cancels; `tick` takes what arrived after each read and may raise to end the batch early. Shortly before
    the deadline each sandbox still running is asked to report; at the deadline the rest are killed, each
    unfinished item saying `unfinished` (and Sandbox.at_deadline set)."""
    deadline = time.monotonic() + batch_timeout
    report_at = deadline - report_grace(batch_timeout)
    while any(not box.finished for box in sandboxes):
        if should_stop():
            raise Cancelled(cancelled)
        now = time.monotonic()
        if now >= deadline:
            reason = f"The batch did not finish within its {batch_timeout:g} s limit; {unfinished}"
            stop_at_deadline([box for box in sandboxes if not box.finished], reason)
            return
        if now >= report_at:
            for box in sandboxes:
                if not box.finished:
                    box.ask_report()
        for key, _ in selector.select(timeout=min(0.2, (report_at if now < report_at else deadline) - now)):
            key.data.read()
            # A closed pipe stays readable, and so does one whose sandbox was cut off for breaking the
            # protocol (nothing more is read from it): stop watching both.
            if key.data.eof or key.data.finished:
                selector.unregister(key.fd)
        for box in sandboxes:
            box.check_exit()
        tick()


def _unjailed_limits(limits: SandboxLimits, cpu_seconds: int) -> Callable[[], None]:
    """The development opt-out's only protection: rlimits on the one process (not its children)."""

    def apply() -> None:  # between fork and exec: setrlimit calls only
        mem = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb << 20, limits.file_mb << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def stop_at_deadline(boxes: list[Sandbox], reason: str) -> None:
    """Kill every process at once, then read what each had written before it died: the worker is free as
    soon as they are gone, and a result sent just before the deadline still counts."""
    for box in boxes:
        box.signal_kill()
    for box in boxes:
        box.end_at_deadline(reason)


class Sandbox(ResultReader):
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
        super().__init__(read_fd, limits)
        self.proc = proc
        self.control_fd = control_fd
        self.log_path = log_path
        self.cpu_seconds = cpu_seconds
        self.jail = jail
        self.at_deadline = False  # killed at the batch's deadline with rollouts unfinished

    @classmethod
    def start(cls, shape: BatchShape, layout: BatchFiles, k: int, jail: Jail | None, *, ahead: bool = False) -> Sandbox:
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
            # Where the run's data attachments are (rollouts.sandbox.attachments): DATA_INSIDE in the jail.
            "ARTWEB_ATTACHMENTS": DATA_INSIDE if jail else str(layout.attachments_dir),
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

    def begin(self, request: RolloutRequest | ScoreRequest, groups: list[int], layout: BatchFiles) -> None:
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
        # The run's own secrets, by names that are never the sandbox's (checked when they were stored, and here).
        env.update({k: v for k, v in getattr(request, "secrets", {}).items() if secret_name_problem(k) is None})
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
        # The control pipe stays open for the report before the deadline (ask_report).

    def ask_report(self) -> None:
        """The batch's deadline is near: ask the guest to answer for every rollout it has not sent (a result,
        or an "unfinished" line: rollouts.sandbox.reader) and say it is done. Once; a guest that is gone or
        does not listen is killed at the deadline all the same."""
        if self.control_fd < 0:
            return
        try:
            # Never blocks the worker: a guest that stopped reading its pipe just gets no report.
            os.set_blocking(self.control_fd, False)
            os.write(self.control_fd, b'{"report": true}\n')
        except OSError:
            pass
        os.close(self.control_fd)
        self.control_fd = -1

    # --- ending ------------------------------------------------------------------------------------

    def check_exit(self) -> None:
        if self.finished:
            return
        if not self._done:
            if self.proc.poll() is None:
                return
            self.drain()
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

    def drain(self) -> None:
        """Read what is still in the pipe of a process that stopped (or was killed), a bounded amount at a time."""
        for _ in range(DRAIN_READS):
            if self.eof or self.finished or not self.read():
                break

    def end_at_deadline(self, reason: str) -> None:
        """Its batch's deadline passed and it was killed (signal_kill): take what it had written, then end it."""
        self.drain()
        if self.finished:  # what it had written broke the protocol: that is its reason
            return
        if self._done and len(self._seen) >= self._expected():  # every answer was in, just in time
            self.finished = True
            self._kill_group()
            return
        self.at_deadline = True
        self.kill(reason)

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
        tail = self.log_tail()
        return (
            "The sandbox process running this rollout stopped before the rollout finished: "
            + why
            + "."
            + (f"\n\nLast output of the sandbox process:\n{tail}" if tail else "")
        )

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - 16_000))
                text = fh.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])[-4000:]

    def signal_kill(self) -> None:
        # Unjailed: the session. Jailed: bwrap, whose death takes the namespace's init, and with it every
        # process of the namespace (--die-with-parent); the cgroup is swept when the batch ends.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _kill_group(self) -> None:
        self.signal_kill()
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
