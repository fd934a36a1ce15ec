"""The sandbox's report before a batch's deadline, against the real jail, guest and result reader.

A rollout that swallows its own timeout holds its batch until the deadline. Shortly before it the worker
closes the sandbox's control pipe, and a thread of the guest answers for every rollout not yet sent: a
finished one with its record, the others with where they were and the last lines they printed. Each test
runs such a batch through run_rollouts as a step does and prints how long after the deadline it returned
(negative: before it, once every sandbox had answered).
"""

from __future__ import annotations

import time

import pytest

from rollouts.sandbox import rollouts as sandbox_rollouts
from rollouts.sandbox.batch import SandboxLimits
from rollouts.sandbox.records import deadline_stopped, deadline_summary
from rollouts.sandbox.rollouts import run_rollouts

pytestmark = pytest.mark.slow  # each waits for a deadline of a few seconds

LIMIT_S = 5.0

# The first rollout of scenario 0 hangs (in asyncio, or in `time.sleep` with `sync`), catching its own
# timeout; every other rollout finishes.
FIRST_HANGS = """
import art, asyncio, itertools, time

counter = itertools.count()

async def rollout(model, scenario):
    n = next(counter)
    print(f"rollout {n} starting")
    if scenario.i == 0 and n == 0:
        print("waiting on the tool")
        while True:
            try:
                HANG
            except BaseException:
                pass
    print(f"rollout {n} done")
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": f"hi {n}"}], reward=1.0)
"""


def first_hangs(hang: str = "await asyncio.sleep(60)") -> str:
    return FIRST_HANGS.replace("HANG", hang)


def timed_run(request, monkeypatch) -> tuple[list, float]:
    started = []
    pump = sandbox_rollouts.pump
    monkeypatch.setattr(sandbox_rollouts, "pump", lambda *a, **k: started.append(time.monotonic()) or pump(*a, **k))
    results = run_rollouts(request)
    after = time.monotonic() - (started[0] + LIMIT_S)
    print(f"deadline to worker free: {after * 1000:.0f} ms")
    return results, after


def limits() -> SandboxLimits:
    return SandboxLimits(rollout_timeout_s=1, batch_timeout_s=LIMIT_S)


def test_a_hung_rollout_is_reported_with_its_last_lines_and_its_finished_sibling_is_kept(request_for, monkeypatch):
    results, after = timed_run(request_for(first_hangs(), limits=limits()), monkeypatch)
    assert after < 0.5  # each sandbox answered: nothing was left to wait for
    hung, sibling = results[0].trajectories
    assert (
        sibling["error"] is None
        and sibling["reward"] == 1.0
        and sibling["logs"] == ["rollout 1 starting", "rollout 1 done"]
    )
    assert hung["logs"] == ["rollout 0 starting", "waiting on the tool"]
    assert deadline_summary(hung["error"]) == (
        "The batch did not finish within its 5 s limit, so it was stopped with 1 rollout unfinished: scenario 0 sample 0."
    )
    assert "This one (scenario 0 sample 0) was still running after " in hung["error"]
    assert (
        hung["error"].split(". The last lines it printed:\n")[1].startswith("rollout 0 starting\nwaiting on the tool\n")
    )
    assert not results[1].errors


def test_a_finished_rollout_whose_group_was_never_scored_keeps_its_trajectory(request_for, monkeypatch):
    score = "def score_group(group, scenario):\n    return [1.0 for _ in group]\n"
    results, _ = timed_run(request_for(first_hangs(), reward=score, limits=limits()), monkeypatch)
    hung, sibling = results[0].trajectories
    assert deadline_stopped(sibling["error"]) and sibling["reward"] is None
    assert "This one (scenario 0 sample 1) had finished but was not scored" in sibling["error"]
    assert sibling["messages"][0]["content"] == "hi 1" and sibling["logs"] == ["rollout 1 starting", "rollout 1 done"]
    assert "2 rollouts unfinished: scenario 0 sample 0, scenario 0 sample 1." in hung["error"]
    assert results[1].rewards == [1.0, 1.0]


def test_a_rollout_that_blocks_its_process_is_reported_with_those_it_held_back(request_for, monkeypatch):
    request = request_for(first_hangs("time.sleep(60)"), scenarios=[{"i": 0}, {"i": 1}], sandboxes=1, limits=limits())
    results, after = timed_run(request, monkeypatch)
    assert after < 0.5
    hung = results[0].trajectories[0]
    assert "This one (scenario 0 sample 0) was still running after " in hung["error"]
    assert hung["logs"] == ["rollout 0 starting", "waiting on the tool"]
    held_back = [t for g in results for t in g.trajectories][1:]
    assert all(
        "had not started (held back by the batch's concurrency, or by a rollout" in t["error"] for t in held_back
    )
    assert "4 rollouts unfinished" in hung["error"]
