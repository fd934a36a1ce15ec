"""A batch that reaches its deadline, against the real jail, proxy and result reader.

Scenario 0's rollouts hang: they print, give the batch's other rollouts a moment, then keep the sandbox
process busy in C code that holds the interpreter (libc's sleep through ctypes.PyDLL), where neither the
rollout's own timeout nor any thread of the process can reach them. The other scenarios finish. Each
test runs the batch through run_rollouts as a step does and checks that what finished is kept with its
logs, that each rollout still running is named in its error, and that the sandbox is gone the moment the
deadline passes: the test prints how long after the deadline run_rollouts returned (the worker free for
its next job).
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from rollouts.sandbox import TooManyErrors
from rollouts.sandbox import rollouts as sandbox_rollouts
from rollouts.sandbox.batch import SandboxLimits
from rollouts.sandbox.records import deadline_stopped, deadline_summary
from rollouts.sandbox.rollouts import run_rollouts
from tests.rollouts.sandbox.test_hostile import named, rename

pytestmark = pytest.mark.slow  # each waits out a deadline of a few seconds

LIMIT_S = 5.0

HANGS = """
import art, asyncio, ctypes, os, sys

async def rollout(model, scenario):
    print(f"scenario {scenario.i} starting")
    if scenario.i == 0:
PREAMBLE
        print("waiting on the tool")
        await asyncio.sleep(0.3)  # the batch's other rollouts finish meanwhile
        while True:
            ctypes.PyDLL(None).sleep(60)  # holds the interpreter: no signal handler or thread of it runs
    print(f"scenario {scenario.i} done")
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}], reward=1.0)
"""


def hangs(preamble: str = "pass") -> str:
    return HANGS.replace("PREAMBLE", "\n".join("        " + line for line in preamble.splitlines()))


def reporting(report: dict) -> str:
    """Scenario 0 writes `report` to the result pipe itself, the line a sandbox may answer for a rollout it
    cannot finish before the deadline, then hangs: the worker's side of such a report, on its own."""
    line = json.dumps({"kind": "unfinished", "group": 0, "index": 0, **report}) + "\n"
    return hangs(f"os.write(int(os.environ['ARTWEB_RESULT_FD']), {line.encode()!r})")


class Timed:
    """When the batch's deadline was (its pump started batch_timeout before) and when run_rollouts returned."""

    def __init__(self, monkeypatch) -> None:
        self.pumped = None
        pump = sandbox_rollouts.pump

        def timed_pump(*args, **kwargs):
            self.pumped = time.monotonic()
            return pump(*args, **kwargs)

        monkeypatch.setattr(sandbox_rollouts, "pump", timed_pump)  # a clock around the real loop, nothing else

    def run(self, request):
        try:
            return run_rollouts(request)
        finally:
            self.freed_after_s = time.monotonic() - (self.pumped + LIMIT_S)
            print(f"deadline to worker free: {self.freed_after_s * 1000:.0f} ms")


def limits(**fields) -> SandboxLimits:
    return SandboxLimits(rollout_timeout_s=1, batch_timeout_s=LIMIT_S, **fields)


def test_it_keeps_what_finished_names_what_hung_and_frees_the_worker_at_the_deadline(request_for, monkeypatch):
    comm = f"hang{uuid.uuid4().hex[:8]}"
    timed = Timed(monkeypatch)
    request = request_for(
        hangs(rename(comm)), scenarios=[{"i": 0}, {"i": 1}, {"i": 2}], sandboxes=2, limits=limits()
    )  # scenario 2 shares its sandbox process with the hung scenario 0
    results = timed.run(request)

    assert timed.freed_after_s < 1.0, f"the worker was held {timed.freed_after_s:.2f} s past the deadline"
    assert named(comm) == []  # the hung sandbox process is gone
    for i in (1, 2):
        finished = results[i].trajectories
        assert [t["reward"] for t in finished] == [1.0, 1.0] and not results[i].errors
        assert all(t["logs"] == [f"scenario {i} starting", f"scenario {i} done"] for t in finished)
    hung = results[0].trajectories
    assert all(deadline_stopped(t["error"]) and t["reward"] is None for t in hung)
    assert deadline_summary(hung[0]["error"]) == (
        "The batch did not finish within its 5 s limit, so it was stopped with 2 rollouts unfinished: "
        "scenario 0 sample 0, scenario 0 sample 1."
    )
    assert "This one (scenario 0 sample 1) had sent no result" in hung[1]["error"]
    assert "its own limit of 1 s (rollout_timeout_s)" in hung[1]["error"]


def test_a_report_gives_each_hung_rollout_the_last_lines_it_printed(request_for, monkeypatch):
    lines = ["step 1", "waiting on the tool"]
    timed = Timed(monkeypatch)
    request = request_for(
        reporting({"state": "running", "seconds": 1.5, "logs": lines}),
        scenarios=[{"i": 0}, {"i": 1}],
        group_size=1,
        limits=limits(),
    )
    results = timed.run(request)

    assert timed.freed_after_s < 1.0
    hung = results[0].trajectories[0]
    assert hung["logs"] == lines  # in the inspector as any rollout's logs
    assert "2 rollouts" not in hung["error"] and "1 rollout unfinished: scenario 0." in hung["error"]
    assert "This one (scenario 0) was still running after 1.5 s. The last lines it printed:\nstep 1\n" in hung["error"]
    assert results[1].trajectories[0]["error"] is None


def test_a_report_is_held_to_its_bounds(request_for, monkeypatch):
    flood = [f"line {n} " + "x" * 5000 for n in range(100)]
    results = Timed(monkeypatch).run(
        request_for(reporting({"state": "running", "logs": flood}), group_size=1, limits=limits())
    )
    hung = results[0].trajectories[0]
    assert len(hung["logs"]) == 20 and hung["logs"][0].startswith("line 80 ")
    assert all(len(line) == 1000 for line in hung["logs"])
    assert len(hung["error"]) < 4000

    forged = run_rollouts(request_for(reporting({"state": "fine"}), group_size=1, limits=limits()))
    assert (
        "broke artweb's result protocol (an unfinished rollout's state must be one of"
        in (forged[0].trajectories[0]["error"])
    )


def test_past_max_exceptions_it_raises_with_what_finished(request_for, monkeypatch):
    with pytest.raises(TooManyErrors) as caught:
        Timed(monkeypatch).run(request_for(hangs(), max_exceptions=1, sandboxes=2, limits=limits()))
    assert str(caught.value).startswith("2 of 4 rollouts failed (max_exceptions=1). The first rollout the deadline")
    assert "stopped with 2 rollouts unfinished: scenario 0 sample 0, scenario 0 sample 1." in str(caught.value)
    groups = caught.value.groups
    assert [t["reward"] for t in groups[1].trajectories] == [1.0, 1.0]
    assert all(deadline_stopped(t["error"]) for t in groups[0].trajectories)
