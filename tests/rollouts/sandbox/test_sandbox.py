"""The sandbox against hostile or broken scripts. None of these scripts calls the model, so no vLLM
server is needed: each one fails in its own way and must end as a recorded error on its rollouts
while the other rollouts and the calling process carry on."""

import json
import os
import subprocess
import sys
import time

import pytest

from rollouts.sandbox import Cancelled, TooManyErrors
from rollouts.sandbox.batch import GUEST, SandboxLimits, failed_record
from rollouts.sandbox.process import Sandbox
from rollouts.sandbox.rollouts import run_rollouts
from tests.rollouts.sandbox.scripts import script


def assert_only_group_zero_failed(results, *needles):
    bad, good = results
    assert [t["reward"] for t in good.trajectories] == [1.0, 1.0]
    assert all(t["error"] is None for t in good.trajectories)
    for t in bad.trajectories:
        assert t["reward"] is None
        for needle in needles:
            assert needle in t["error"], t["error"]


@pytest.mark.slow
def test_it_stops_an_infinite_loop_at_the_rollout_timeout(request_for):
    started = time.monotonic()
    results = run_rollouts(request_for(script("while True:\n    pass"), rollout_timeout_s=2))
    assert_only_group_zero_failed(results, "Timed out", "2 s")
    assert time.monotonic() - started < 30


def test_it_stops_a_rollout_that_awaits_forever(request_for):
    results = run_rollouts(request_for(script("await asyncio.sleep(3600)"), rollout_timeout_s=2))
    assert_only_group_zero_failed(results, "Timed out")


def test_it_survives_a_fork_bomb(request_for):
    results = run_rollouts(
        request_for(
            script("while True:\n    os.fork()"),
            sandboxes=2,
            limits=SandboxLimits(rollout_timeout_s=20, max_processes=16),
        )
    )
    # The fork is refused once the process budget is spent; the rollout fails with that error.
    bad, good = results
    assert [t["reward"] for t in good.trajectories] == [1.0, 1.0]
    assert all("process" in t["error"] for t in bad.trajectories), [t["error"] for t in bad.trajectories]


def test_it_turns_a_memory_bomb_into_a_memory_error(request_for):
    results = run_rollouts(
        request_for(script("hog = bytearray(64 * 1024**3)"), limits=SandboxLimits(rollout_timeout_s=20, memory_mb=1024))
    )
    assert_only_group_zero_failed(results, "MemoryError", 'File "rollout.py", line 6')


def test_it_records_os_exit_on_the_unfinished_rollouts_only(request_for):
    results = run_rollouts(request_for(script("await asyncio.sleep(0.5)\nos._exit(3)"), sandboxes=2))
    assert_only_group_zero_failed(results, "exited with status 3")


def test_it_hides_the_callers_environment(request_for, monkeypatch):
    monkeypatch.setenv("ARTWEB_TEST_SECRET", "hunter2")
    monkeypatch.setenv("DATABASE_URL", "postgres://u:hunter2@db/x")
    probe = """
import art, os

async def rollout(model, scenario):
    leaked = [k for k, v in os.environ.items() if "hunter2" in v]
    return art.Trajectory(reward=1.0, metadata={"leaked": leaked, "keys": sorted(os.environ)})
"""
    results = run_rollouts(request_for(probe))
    for t in results[0].trajectories:
        assert t["error"] is None
        assert t["metadata"]["leaked"] == []
        assert "DATABASE_URL" not in t["metadata"]["keys"] and "OPENAI_BASE_URL" in t["metadata"]["keys"]
        # Its own working directory, not the caller's.
    assert os.environ["ARTWEB_TEST_SECRET"] == "hunter2"


def test_it_reports_a_syntax_error_on_every_rollout(request_for):
    results = run_rollouts(request_for("import art\n\nasync def rollout(model, scenario)\n    pass\n"))
    errors = [t["error"] for g in results for t in g.trajectories]
    assert len(errors) == 4
    assert all("SyntaxError" in e and "line 3" in e for e in errors)


def test_it_reports_an_exception_with_the_users_traceback_and_logs(request_for):
    results = run_rollouts(request_for(script('print("about to fail")\nraise ValueError("bad scenario")')))
    failed = results[0].trajectories[0]
    assert failed["error"].startswith("ValueError: bad scenario")
    assert 'File "rollout.py", line 7, in rollout' in failed["error"]
    assert "_artweb_guest" not in failed["error"]
    assert "_artweb_runner" not in failed["error"]  # the guest's own package, beside its entry
    assert failed["logs"] == ["about to fail"]


def test_it_rejects_non_finite_and_non_numeric_rewards(request_for):
    reward = "def reward(trajectory, scenario):\n    return [float('nan'), 'high'][scenario.i]\n"
    results = run_rollouts(request_for(script("pass"), reward=reward))
    assert "finite number" in results[0].trajectories[0]["error"]
    assert "got str: 'high'" in results[1].trajectories[0]["error"]


def test_it_scores_groups_with_score_group(request_for):
    score = "async def score_group(group, scenario):\n    return [i / 2 for i, _ in enumerate(group)]\n"
    results = run_rollouts(request_for(script("pass"), reward=score, scenarios=[{"i": 1}]))
    assert results[0].rewards == [0.0, 0.5]


def test_it_raises_cancelled_when_told_to_stop(request_for):
    started = time.monotonic()
    with pytest.raises(Cancelled):
        run_rollouts(request_for(script("await asyncio.sleep(60)")), should_stop=lambda: time.monotonic() - started > 1)
    assert time.monotonic() - started < 10


def test_it_gives_up_past_max_exceptions(request_for):
    with pytest.raises(TooManyErrors) as info:
        run_rollouts(request_for(script('raise RuntimeError("nope")'), max_exceptions=1))
    assert "RuntimeError: nope" in str(info.value)


@pytest.mark.slow
def test_it_enforces_the_batch_timeout(request_for):
    blocking = script(
        "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except BaseException:\n        pass"
    )
    started = time.monotonic()
    results = run_rollouts(request_for(blocking, limits=SandboxLimits(rollout_timeout_s=1, batch_timeout_s=6)))
    assert time.monotonic() - started < 20
    assert all("6 s limit" in t["error"] for t in results[0].trajectories)


def test_it_times_the_reward_function_per_trajectory_and_shares_a_group_rewards_time(request_for):
    slow = "import time\n\ndef reward(trajectory, scenario):\n    time.sleep(0.3)\n    return 1.0\n"
    results = run_rollouts(request_for(script("pass"), reward=slow, scenarios=[{"i": 1}]))
    timed = [t["reward_ms"] for t in results[0].trajectories]
    assert all(300 <= ms < 3000 for ms in timed), timed
    assert all(t["duration_ms"] >= t["reward_ms"] for t in results[0].trajectories)

    group = "import time\n\ndef score_group(group, scenario):\n    time.sleep(0.4)\n    return [1.0 for _ in group]\n"
    results = run_rollouts(request_for(script("pass"), reward=group, scenarios=[{"i": 1}]))
    shares = [t["reward_ms"] for t in results[0].trajectories]
    assert len(shares) == 2 and all(200 <= ms < 2000 for ms in shares), shares  # 0.4 s over two trajectories


def test_nul_characters_in_a_trajectory_are_dropped_so_the_step_can_store_it(request_for):
    nul = (
        "import art\n\nasync def rollout(model, scenario):\n"
        "    return art.Trajectory(reward=1.0, messages_and_choices=[{'role': 'user', 'content': 'a\\x00b'}],\n"
        "                          metadata={'k\\x00': 'v\\x00'}, logs=['line\\x00'])\n"
    )
    results = run_rollouts(request_for(nul, scenarios=[{"i": 0}]))
    t = results[0].trajectories[0]
    assert t["error"] is None and t["messages"][0]["content"] == "ab"
    assert t["metadata"] == {"k": "v"} and "\x00" not in str(t["logs"])


def test_it_kills_a_sandbox_that_said_done_instead_of_waiting_for_its_exit(monkeypatch, tmp_path):
    # Its last line is in, but its process may still be tearing its interpreter down or be held by a
    # thread the script left: the batch must not wait on it. This one (sleep) never exits by itself.
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    read_fd, write_fd = os.pipe()
    control_read, control_write = os.pipe()
    os.close(control_read)
    os.set_blocking(read_fd, False)
    box = Sandbox(proc, read_fd, control_write, tmp_path / "log", SandboxLimits(), 60, None)
    box.groups, box.group_size = [0], 1
    line = {"kind": "trajectory", "group": 0, "index": 0, "trajectory": failed_record("x")}
    os.write(write_fd, (json.dumps(line) + "\n" + json.dumps({"kind": "done"}) + "\n").encode())

    killed, waited_on_a_live_process = [], []
    real_killpg, real_wait = os.killpg, proc.wait

    def killpg(pgid, sig):
        killed.append(pgid)
        real_killpg(pgid, sig)

    def wait(timeout=None):
        if proc.poll() is None and proc.pid not in killed:
            waited_on_a_live_process.append(timeout)
            raise subprocess.TimeoutExpired(proc.args, timeout)
        return real_wait(timeout)

    monkeypatch.setattr(os, "killpg", killpg)
    monkeypatch.setattr(proc, "wait", wait)
    try:
        box.read()
        box.check_exit()
        assert box.finished and box.exit_reason is None
        assert [(g, i) for g, i, _ in box.take()] == [(0, 0)]
        assert waited_on_a_live_process == []
        assert real_wait(timeout=10) == -9  # killed, not left to exit
    finally:
        proc.kill()
        real_wait()
        box.cleanup()
        os.close(write_fd)


def test_the_guest_skips_the_interpreters_teardown_after_its_last_line(tmp_path):
    # Its results are all sent with "done": exit hooks and the teardown of every module it imported
    # (a few hundred ms of CPU with the OpenAI client) would only delay its batch.
    (tmp_path / "rollout.py").write_text(
        "import art, atexit, os\n"
        "atexit.register(lambda: os.write(2, b'teardown ran'))\n\n"
        "async def rollout(model, scenario):\n"
        "    return art.Trajectory(messages_and_choices=[{'role': 'user', 'content': 'x'}], reward=1.0)\n"
    )
    spec = {
        "groups": [{"index": 0, "scenario": {}}],
        "group_size": 1,
        "model_name": "none",
        "reward_kind": None,
        "concurrency": 1,
        "rollout_timeout_s": 20,
        "max_processes": 8,
    }
    (tmp_path / "batch.json").write_text(json.dumps(spec))
    result_read, result_write = os.pipe()
    control_read, control_write = os.pipe()
    env = {
        "PATH": "/usr/bin:/bin",
        "ARTWEB_RESULT_FD": str(result_write),
        "ARTWEB_CONTROL_FD": str(control_read),
        "ARTWEB_PROXY_SOCKET": str(tmp_path / "inference.sock"),
        "HOME": str(tmp_path),
    }
    proc = subprocess.Popen(
        [sys.executable, "-I", "-u", str(GUEST), str(tmp_path / "batch.json")],
        env=env,
        pass_fds=(result_write, control_read),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    os.close(result_write)
    os.close(control_read)
    os.write(control_write, b'{"env": {}}\n')
    os.close(control_write)
    output, _ = proc.communicate(timeout=60)
    with os.fdopen(result_read, "rb") as results:
        kinds = [json.loads(line)["kind"] for line in results.read().splitlines()]
    assert proc.returncode == 0, output
    assert kinds == ["trajectory", "done"]
    assert b"teardown ran" not in output
