"""The worker's own caps on what a batch sends back, against the real jail and result reader.

The guest replaces a trajectory over its 4 MB cap with an error, but user code runs in the guest's
process: it can write lines to the result pipe's descriptor itself, or raise the guest's cap. Each test
here is such a script, run through run_rollouts (or run_scores) as a step runs it, and checks that the
worker refused what broke a cap, named the cap and the size in that rollout's error, and kept the
well-behaved rollouts of the batch. A few tests drive one sandbox's reader over a plain pipe: they check
the reader alone, with no jail in the way.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest

from rollouts.sandbox.batch import SandboxLimits, failed_record
from rollouts.sandbox.process import Sandbox
from rollouts.sandbox.rollouts import run_rollouts
from rollouts.sandbox.scores import ScoreGroup, ScoreRequest, run_scores
from tests.rollouts.sandbox.scripts import script
from tests.rollouts.sandbox.test_hostile import good_group_ok

MB = 1 << 20

# Code for a rollout of scenario 0: the first one writes `line(index)` straight to the result pipe, for
# its own slot, and keeps the guest from sending its real record for that slot (which would be a
# duplicate, and end the sandbox for breaking the protocol rather than for the size).
STRAIGHT_TO_THE_PIPE = """
import builtins
guest = sys.modules['__main__']
if not hasattr(builtins, 'forged'):
    builtins.forged = True
    send = guest.ResultPipe.send
    def send_all_but_mine(self, message, send=send):
        if message.get('kind') == 'trajectory' and (message['group'], message['index']) == (0, 0):
            return
        send(self, message)
    guest.ResultPipe.send = send_all_but_mine
    data = (LINE + '\\n').encode()
    view = memoryview(data)
    fd = int(os.environ['ARTWEB_RESULT_FD'])
    while view:
        view = view[os.write(fd, view):]
"""


def record(**fields) -> dict:
    return {**failed_record("x"), "error": None, "reward": 0.5, **fields}


def forging(line: str) -> str:
    """A script whose scenario-0 rollout writes `line` (a Python expression for a str) to the pipe."""
    return script(STRAIGHT_TO_THE_PIPE.replace("LINE", line))


def test_a_record_written_straight_to_the_pipe_over_the_limit_fails_only_its_rollout(request_for):
    # The attack of the review: 7.9 MB records, under the worker's old 8 MB line limit, were stored.
    big = record(metadata={"blob": "x" * int(7.9 * MB)})
    line = json.dumps({"kind": "trajectory", "group": 0, "index": 0, "trajectory": big})
    results = run_rollouts(request_for(forging(repr(line)), sandboxes=1))
    forged, honest = results[0].trajectories
    assert forged["reward"] is None and forged["metadata"] == {}
    assert "The trajectory is 7.9 MB as JSON; the limit is 4.0 MB (SandboxLimits.record_bytes)" in forged["error"]
    # The same sandbox went on: the group's other rollout and the other group are whole.
    assert honest["error"] is None and honest["reward"] == 1.0
    good_group_ok(results)


def test_a_script_that_raises_the_guests_own_cap_is_refused_by_the_worker(request_for):
    raise_cap = (
        "sys.modules['_artweb_runner.results'].MAX_RECORD_BYTES = 1 << 30\n"
        "return art.Trajectory(messages_and_choices=[{'role': 'user', 'content': 'hi'}], reward=1.0,\n"
        "                      metadata={'blob': 'y' * (5 << 20)})\n"
    )
    results = run_rollouts(request_for(script(raise_cap), sandboxes=1))
    assert all(t["reward"] is None for t in results[0].trajectories)
    assert all("(SandboxLimits.record_bytes)" in t["error"] for t in results[0].trajectories)
    good_group_ok(results)


def test_the_guest_is_given_the_workers_record_limit(request_for):
    # A smaller limit reaches the guest, which replaces the record itself (keeping its logs and token
    # counts), so an honest script never meets the worker's refusal.
    honest = "print('a log line')\nreturn art.Trajectory(messages_and_choices=[{'role': 'user', 'content': 'z' * 100_000}], reward=1.0)\n"
    limits = SandboxLimits(rollout_timeout_s=20, record_bytes=50_000)
    results = run_rollouts(request_for(script(honest), sandboxes=1, limits=limits))
    for t in results[0].trajectories:
        assert t["error"].startswith("The trajectory is") and "as JSON; the limit is" in t["error"], t["error"]
        assert t["logs"] == ["a log line"]
    good_group_ok(results)


def test_a_line_past_twice_the_record_limit_stops_the_sandbox_and_names_the_limit(request_for):
    line = json.dumps(
        {"kind": "trajectory", "group": 0, "index": 0, "trajectory": record(metadata={"b": "x" * 300_000})}
    )
    limits = SandboxLimits(rollout_timeout_s=20, record_bytes=100_000)
    results = run_rollouts(request_for(forging(repr(line)), sandboxes=2, limits=limits))
    for t in results[0].trajectories:
        assert "broke artweb's result protocol" in t["error"]
        assert "more than 0.2 MB, twice the limit of 0.1 MB on one record (SandboxLimits.record_bytes)" in t["error"]
    good_group_ok(results)


def test_the_batchs_records_together_are_capped(request_for):
    # Each rollout of scenario 0 sends 150 kB; the batch may keep 250 kB: the second one no longer fits.
    fat = "return art.Trajectory(messages_and_choices=[{'role': 'user', 'content': 'hi'}], reward=1.0, metadata={'b': 'x' * 150_000})\n"
    limits = SandboxLimits(rollout_timeout_s=20, batch_bytes=250_000)
    results = run_rollouts(request_for(script(fat), sandboxes=1, limits=limits))
    errors = [t["error"] for t in results[0].trajectories]
    assert sorted(e is None for e in errors) == [False, True], errors
    (error,) = [e for e in errors if e]
    assert "The batch's results reached their limit of 0.2 MB together (SandboxLimits.batch_bytes)" in error
    assert "this trajectory (0.1 MB) was not kept" in error
    good_group_ok(results)


def test_records_past_what_a_sandbox_may_send_stop_it(request_for):
    # A valid record for its own slot, then the same again and again: one record per rollout is all a
    # sandbox may send. The first excess line ends it; what it had sent within the bound is kept.
    flood = (
        "fd = int(os.environ['ARTWEB_RESULT_FD'])\n"
        "rec = {'messages': [], 'tools': None, 'reward': 0.5, 'metrics': {}, 'metadata': {}, 'logs': [], "
        "'error': None, 'duration_ms': 1, 'prompt_tokens': 0, 'completion_tokens': 0}\n"
        "line = (json.dumps({'kind': 'trajectory', 'group': 0, 'index': 0, 'trajectory': rec}) + '\\n').encode()\n"
        "for _ in range(10_000):\n"
        "    os.write(fd, line)\n"
        "await asyncio.sleep(5)\n"
    )
    results = run_rollouts(request_for(script(flood), sandboxes=2))
    first, second = results[0].trajectories
    assert first["reward"] == 0.5 and first["error"] is None  # the one record within the bound
    assert "it sent trajectory 0 of group 0 twice" in second["error"]
    assert "it may send one trajectory per rollout it runs, then one done line: 3 lines in all" in second["error"]
    good_group_ok(results)


def test_a_line_nested_200000_deep_is_a_recorded_error_not_an_exception(request_for):
    deep = (
        "fd = int(os.environ['ARTWEB_RESULT_FD'])\n"
        'line = \'{"kind": "trajectory", "group": 0, "index": 0, "trajectory": \' + \'[\' * 200_000 + '
        "']' * 200_000 + '}\\n'\n"
        "os.write(fd, line.encode())\n"
        "await asyncio.sleep(5)\n"
    )
    results = run_rollouts(request_for(script(deep), sandboxes=2))
    for t in results[0].trajectories:
        assert "broke artweb's result protocol" in t["error"]
        assert "nested more than 100 levels deep, the limit (SandboxLimits.record_depth)" in t["error"]
    good_group_ok(results)


def test_a_score_over_the_record_limit_fails_that_score_only():
    # Score mode reads with the same reader and the same caps: a reward that raises the guest's cap and
    # puts 5 MB in the metrics gets that trajectory's score refused; the other sandbox's scores stand.
    reward = (
        "import sys\n\n"
        "def reward(trajectory, scenario):\n"
        "    if scenario['i'] == 0:\n"
        "        sys.modules['_artweb_runner.results'].MAX_RECORD_BYTES = 1 << 30\n"
        "        trajectory.metrics['blob'] = 'x' * (5 << 20)\n"
        "    return 1.0\n"
    )
    stored = {"messages": [{"role": "user", "content": "q"}], "tools": None, "metrics": {}, "metadata": {}}
    groups = [ScoreGroup(scenario={"i": g}, trajectories=[stored, stored]) for g in range(2)]
    scores = run_scores(
        ScoreRequest(groups=groups, reward=reward, sandboxes=2, limits=SandboxLimits(rollout_timeout_s=20))
    )
    assert [s["reward"] for s in scores[0]] == [None, None]
    assert all(
        "The score is 5.0 MB as JSON; the limit is 4.0 MB (SandboxLimits.record_bytes)" in s["error"] for s in scores[0]
    )
    assert [s["reward"] for s in scores[1]] == [1.0, 1.0]


# --- the reader alone, over a plain pipe -----------------------------------------------------------------


@pytest.fixture
def reader(tmp_path):
    """A rollout sandbox's reader for one group of two, reading a pipe that send() fills from a thread;
    its process is a `sleep` that plays no part (the reader never waits on it)."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    read_fd, write_fd = os.pipe()
    control_read, control_write = os.pipe()
    os.close(control_read)
    os.set_blocking(read_fd, False)
    box = Sandbox(proc, read_fd, control_write, tmp_path / "log", SandboxLimits(), 60, None)
    box.groups, box.group_size = [0], 2
    writers = []

    def send(data: bytes) -> None:
        def write():
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(write_fd, view) :]
            finally:
                os.close(write_fd)

        writers.append(threading.Thread(target=write, daemon=True))
        writers[-1].start()

    def read_until(done, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not done() and time.monotonic() < deadline:
            box.read()
            time.sleep(0.001)

    yield box, send, read_until
    box.cleanup()  # closes the read end: a writer still blocked gets EPIPE and ends
    for writer in writers:
        writer.join(timeout=5)


def test_the_reader_records_a_deeply_nested_line_as_the_sandboxs_error(reader):
    box, send, read_until = reader
    send(b'{"kind": "done", "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}\n")
    read_until(lambda: box.finished or box.eof)
    assert box.finished and box.take() == []
    assert "nested more than 100 levels deep, the limit (SandboxLimits.record_depth)" in box.exit_reason


def test_the_reader_fails_an_oversized_record_and_reads_on(reader):
    box, send, read_until = reader
    big = {"kind": "trajectory", "group": 0, "index": 0, "trajectory": record(metadata={"b": "x" * (5 * MB)})}
    small = {"kind": "trajectory", "group": 0, "index": 1, "trajectory": record()}
    send((json.dumps(big) + "\n" + json.dumps(small) + "\n").encode())
    taken = []
    read_until(lambda: len(taken.extend(box.take()) or taken) == 2 or box.finished)
    (first, second) = sorted(taken, key=lambda item: item[1])
    assert first[2]["reward"] is None and "The trajectory is 5.0 MB as JSON" in first[2]["error"]
    assert second[2] == record()
    assert not box.finished
