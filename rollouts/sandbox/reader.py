"""The worker's one reader of what a sandbox sends back: the parser of untrusted input.

A sandbox process writes one JSON line per result to a pipe, then a "done" line. User code shares the
guest's process and can write to that pipe itself, so every byte of it is the user's word: each line is
bounded in length and depth before it is parsed (rollouts.sandbox.records.parse_line), each record is
checked before it is kept, the batch's records share one byte budget, and a sender that breaks the
protocol (garbage, a flood, a record for a slot it does not own, twice the same one) is stopped.

Both modes read with this same code: a rollout sandbox sends "trajectory" lines, a score sandbox "score"
lines (rollouts.sandbox.scores.ScoreSandbox says which slots it owns and how a score is checked); every
cap is the worker's own (SandboxLimits). A rollout sandbox asked to report before its batch's deadline
(rollouts.sandbox.process.pump) may answer for a rollout it could not finish with an "unfinished" line
instead: where it was, the last lines it printed and, once it had finished, its unscored trajectory,
kept in `reports` for that rollout's error.
"""

from __future__ import annotations

import os

from rollouts.sandbox.batch import SandboxLimits, failed_record
from rollouts.sandbox.records import (
    RECORD_ENVELOPE_BYTES,
    RecordError,
    ResultBudget,
    check_trajectory,
    check_unfinished,
    line_limit,
    megabytes,
    parse_line,
)

READ_CHUNK = 1 << 20  # bytes read from one sandbox per turn of the loop, so a flood cannot hold it


class ResultReader:
    """What one sandbox process sent: its records, ready to take(), until it is done or stopped.

    The process behind it (rollouts.sandbox.process.Sandbox) sets its slots when it begins (groups,
    group_size, vocab_size), shares the batch's budget, and says how it is stopped (kill)."""

    KINDS = ("trajectory", "unfinished", "done")  # the lines this sandbox may send
    WHAT = "trajectory"  # the key of a line's record, and what people read in the errors
    SLOT = "rollout it runs"  # what each of its records answers for

    def __init__(self, read_fd: int, limits: SandboxLimits) -> None:
        self.groups: list[int] = []  # set by begin()
        self.group_size = 0
        self.vocab_size: int | None = None
        self.read_fd = read_fd
        self.limits = limits
        self.finished = False
        self.exit_reason: str | None = None
        self._buffer = b""
        self._ready: list[tuple[int, int, dict]] = []
        self._seen: set[tuple[int, int]] = set()
        self.reports: dict[tuple[int, int], dict] = {}  # (group, index) -> an "unfinished" line's report
        self._done = False
        self.eof = False
        self.budget = ResultBudget(limits.batch_bytes)  # the batch's own, shared by its processes (hand_over)

    def kill(self, reason: str) -> None:
        """Stop the sender for good, `reason` its exit_reason (the process knows how: Sandbox.kill)."""
        raise NotImplementedError

    def read(self) -> bool:
        """Take what is waiting on the pipe, at most READ_CHUNK bytes: the caller's loop keeps its deadline.
        False when nothing was waiting."""
        if self.finished and self.exit_reason is not None:
            return False
        try:
            chunk = os.read(self.read_fd, READ_CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self.eof = True
            return False
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        longest = max([len(self._buffer), *map(len, lines)])
        if longest > (limit := line_limit(self.limits.record_bytes)):
            self._violation(
                f"it sent a line of more than {megabytes(limit)}, twice the limit of "
                f"{megabytes(self.limits.record_bytes)} on one record (SandboxLimits.record_bytes)"
            )
            return True
        for line in lines:
            try:
                self._accept(parse_line(line, self.KINDS, max_depth=self.limits.record_depth), len(line))
            except RecordError as exc:
                self._violation(str(exc))
                break
        return True

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
        if message["kind"] == "unfinished":
            report = check_unfinished(message)
            if message.get(self.WHAT) is not None:  # it had finished; its group's scoring had not
                report["record"] = self._keep(message[self.WHAT], size)
            self.reports[(group, index)] = report
        else:
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

    def _expected(self) -> int:
        """Results this sandbox owes: one per rollout of its groups."""
        return len(self.groups) * self.group_size
