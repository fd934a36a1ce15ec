"""The person's code as the guest loads and surrounds it: each rollout's own log (what it prints), its
errors told through its own frames only, and the budget of processes it may start."""

from __future__ import annotations

import inspect
import io
import linecache
import os
import sys
import traceback
import types
from contextvars import ContextVar
from pathlib import Path

MAX_LOG_LINES = 500
MAX_LOG_LINE_CHARS = 4000


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

    def tail(self, n: int) -> list[str]:
        """The last n lines written so far, the one still without its newline included (another thread's
        read: a copy, never the list itself)."""
        lines = list(self.lines[-n:])
        return (lines + [self._partial])[-n:] if self._partial else lines

    def finish(self) -> list[str]:
        if self._partial:
            self._add(self._partial)
            self._partial = ""
        if self.dropped:
            self.lines.append(f"[{self.dropped} more log lines dropped]")
        return self.lines


current_log: ContextVar[RolloutLog | None] = ContextVar("artweb_log", default=None)


class RoutedStream(io.TextIOBase):
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

    def fileno(self) -> int:
        """The sandbox process's own output, for a subprocess handed sys.stdout or sys.stderr (an MCP stdio
        client's `errlog`, for one): what a child writes there cannot be told apart by rollout, so it goes
        to the sandbox's log, shown when that process dies, not to a rollout's."""
        return self._fallback.fileno()


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


def bundle_import_path(workdir: Path) -> set[str]:
    """Make a bundle's modules importable as they are beside `python rollout.py`: the batch's folder first on
    sys.path, then each pure-Python wheel in it (a wheel is a zip, which zipimport reads). A plain script's
    folder holds only the batch's own files. Returns the names of its Python files, for error tracebacks."""
    wheels = sorted(str(p) for p in workdir.rglob("*.whl") if p.is_file())
    sys.path[:0] = [str(workdir), *wheels]
    return {p.name for p in workdir.rglob("*.py")}


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
