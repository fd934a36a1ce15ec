"""One sandbox process, as the worker drives it: started first (it imports the SDK and waits), then given
its part of a batch, read (rollouts.sandbox.reader) until it is done, and ended, saying why when it
stopped early. And the loop that reads a batch's processes until every one has finished.
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
from rollouts.sandbox.batch import GUEST, PASSED_ENV, BatchFiles, BatchShape, SandboxLimits
from rollouts.sandbox.jail import Jail, guest_python_args
from rollouts.sandbox.reader import ResultReader
from rollouts.sandbox.seccomp import filter_fd

if TYPE_CHECKING:
    from rollouts.sandbox.rollouts import RolloutRequest
    from rollouts.sandbox.scores import ScoreRequest

PRESTART_NICE = 19  # CPU priority of a pre-started jailed batch until its hand-over (in the idle class)


def pump(sandboxes, selector, *, batch_timeout: float, should_stop, tick, cancelled: str, unfinished: str) -> None:
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


def _unjailed_limits(limits: SandboxLimits, cpu_seconds: int) -> Callable[[], None]:
    """The development opt-out's only protection: rlimits on the one process (not its children)."""

    def apply() -> None:  # between fork and exec: setrlimit calls only
        mem = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb << 20, limits.file_mb << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


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
