"""Pre-started batches: a run's next batch of rollouts gets a jail whose interpreter has already imported
the SDK and the OpenAI client, and nothing else of it may differ from a batch started cold.

Each test runs the real jail (bubblewrap, cgroups, the sandbox uid). A probe script reports, from inside,
what its process is: whether the OpenAI client was imported before the script was loaded, how long ago
its process started, its CPU priority, its pid namespace, the batch's step, and whether anything an
earlier batch's code left (a file in /tmp, a module-level value) is there. The time saved is measured
by bench/rollout_bench.py (its "sandbox start-up" line), not here: a timed test would only be flaky.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollouts.sandbox import mounts
from rollouts.sandbox.batch import SandboxLimits
from rollouts.sandbox.prestart import PrestartedBatches, StartedBatch, prestarted
from rollouts.sandbox.process import PRESTART_NICE
from rollouts.sandbox.rollouts import _rollout_shape, run_rollouts

PROBE = """
import art, builtins, os, sys

PRELOADED = "openai" in sys.modules  # before this script imported anything of its own

async def rollout(model, scenario):
    ticks = os.sysconf("SC_CLK_TCK")
    started = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19]) / ticks
    uptime = float(open("/proc/uptime").read().split()[0])
    out = {"preloaded": PRELOADED, "age_s": uptime - started, "nice": os.getpriority(os.PRIO_PROCESS, 0),
           "policy": os.sched_getscheduler(0),
           "step": os.environ["ARTWEB_STEP"], "pid_ns": os.readlink("/proc/self/ns/pid"),
           "tmp_left": os.path.exists("/tmp/left-behind"), "module_left": hasattr(builtins, "left_behind"),
           "files": sorted(os.listdir("/batch"))}
    open("/tmp/left-behind", "w").write("from an earlier batch")
    builtins.left_behind = True
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=1.0, metadata=out)
"""


@pytest.fixture(autouse=True)
def _no_other_prestarted_batches():
    # Steps run by other tests of this process may have left their run's next batch pre-started.
    prestarted.discard()
    yield
    prestarted.discard()


@pytest.fixture
def probe(request_for):
    """A one-rollout batch of the probe for run `run`, at `step`; returns what the probe saw."""

    def run(run: int, *, step: int, prestart_next: bool = False, **kwargs) -> dict:
        results = run_rollouts(
            request_for(
                PROBE,
                scenarios=[{"i": 0}],
                group_size=1,
                sandboxes=1,
                step=step,
                warm_key=f"run-{run}",
                prestart_next=prestart_next,
                **kwargs,
            )
        )
        record = results[0].trajectories[0]
        assert record["error"] is None, record["error"]
        return record["metadata"]

    return run


def held(key: str) -> StartedBatch:
    """The batch pre-started for `key` (looked at from outside, never handed to anyone by this)."""
    assert key in prestarted.keys()  # once its pre-start, which a batch leaves to another thread, is done
    return prestarted._by_key[key]


def traces(batch: StartedBatch) -> dict[str, object]:
    """Where a pre-started batch lives on the host: its processes, cgroup directories and files."""
    return {
        "pids": batch.jail.cgroup.pids(),
        "cgroups": list(batch.jail.cgroup.dirs.values()),
        "root": batch.layout.root,
    }


def assert_gone(where: dict) -> None:
    for pid in where["pids"]:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"process {pid} of the batch is still alive"
    assert not any(d.exists() for d in where["cgroups"])
    assert not where["root"].exists()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


@pytest.mark.slow
def test_it_hands_the_prestarted_batch_to_the_runs_next_batch_only(probe):
    first = probe(1, step=1, prestart_next=True)
    assert first["preloaded"] is False  # a cold batch imports only what its code does
    assert prestarted.keys() == ["run-1"]
    waiting = traces(held("run-1"))
    assert waiting["pids"]
    assert all(os.getpriority(os.PRIO_PROCESS, pid) == PRESTART_NICE for pid in waiting["pids"])
    # The idle class: it runs only on a core that nothing else of the machine wants.
    assert all(os.sched_getscheduler(pid) == os.SCHED_IDLE for pid in waiting["pids"])
    assert list((waiting["root"] / "shared").glob("sandbox-*/*")) == []  # no user code or data before the hand-over

    other_run = probe(2, step=5)  # another run, same shape: never gets run 1's processes
    assert other_run["preloaded"] is False
    assert prestarted.keys() == ["run-1"]
    assert all(Path(f"/proc/{pid}").exists() for pid in waiting["pids"])

    time.sleep(1.0)
    second = probe(1, step=2)
    assert second["preloaded"] is True  # the SDK and the OpenAI client were imported before the batch
    assert second["age_s"] >= 1.0  # in the process started at the end of the first batch
    assert (second["nice"], second["policy"]) == (0, os.SCHED_OTHER)  # normal priority from the hand-over on
    assert second["step"] == "2"  # the batch's own environment, given at the hand-over
    assert second["files"] == ["batch.json", "rollout.py"]
    # A jail of its own: nothing the first batch's code did is there.
    assert second["pid_ns"] != first["pid_ns"]
    assert (second["tmp_left"], second["module_left"]) == (False, False)
    assert prestarted.keys() == []
    assert_gone(waiting)  # closed with its batch, like any other


def test_a_batch_prestarted_from_a_thread_that_ended_stays_alive_for_the_next_batch(request_for):
    """add_soon() returns at once and forks on the process's own pre-starting thread, which lives as long as
    the process: the batch is alive, and handed over, after the caller's thread ended. (The synchronous
    add() from a short-lived thread passes this too on the kernels seen so far.)"""
    import threading

    pool = PrestartedBatches()
    shape, _ = _rollout_shape(request_for(PROBE, scenarios=[{"i": 0}], group_size=1, sandboxes=1))
    try:
        caller = threading.Thread(target=pool.add_soon, args=("run-1", shape))
        caller.start()
        caller.join()
        assert pool.keys() == ["run-1"]  # waits for the pre-start itself
        where = traces(pool._by_key["run-1"])
        time.sleep(1.0)
        assert where["pids"] and all(Path(f"/proc/{pid}").exists() and not _zombie(pid) for pid in where["pids"])
        batch = pool.take("run-1", shape)
        assert batch is not None and batch.alive()
        batch.close()
        assert_gone(where)
    finally:
        pool.discard()


def test_it_never_offers_a_prestarted_batch_twice(probe):
    probe(1, step=1, prestart_next=True)
    taken = probe(1, step=2)
    again = probe(1, step=3)
    assert taken["preloaded"] is True
    assert again["preloaded"] is False  # started cold: the pre-started one went with the step-2 batch
    assert again["pid_ns"] != taken["pid_ns"]
    assert (again["tmp_left"], again["module_left"]) == (False, False)


def test_it_discards_a_prestarted_batch_of_another_shape_and_starts_cold(probe):
    probe(1, step=1, prestart_next=True)
    waiting = traces(held("run-1"))
    smaller = probe(1, step=2, limits=SandboxLimits(rollout_timeout_s=20, memory_mb=1024))
    assert smaller["preloaded"] is False
    assert prestarted.keys() == []
    assert_gone(waiting)


def test_it_starts_cold_when_the_prestarted_processes_died(probe):
    probe(1, step=1, prestart_next=True)
    waiting = held("run-1")
    waiting.jail.cgroup.kill_all()
    result = probe(1, step=2)
    assert result["preloaded"] is False
    assert_gone(traces(waiting))


def test_it_removes_an_unused_prestarted_batch_after_its_max_age(request_for):
    pool = PrestartedBatches(max_age_s=1.0)
    shape, _ = _rollout_shape(request_for(PROBE, scenarios=[{"i": 0}], group_size=1, sandboxes=1))
    pool.add("run-1", shape)
    where = traces(pool._by_key["run-1"])
    assert where["pids"] and where["root"].exists()
    deadline = time.monotonic() + 20
    while (pool.keys() or where["root"].exists()) and time.monotonic() < deadline:  # its files go last
        time.sleep(0.1)
    assert pool.keys() == []
    assert_gone(where)


def test_it_keeps_one_prestarted_batch_per_run_and_a_few_in_all(request_for):
    pool = PrestartedBatches(capacity=2)
    shape, _ = _rollout_shape(request_for(PROBE, scenarios=[{"i": 0}], group_size=1, sandboxes=1))
    try:
        pool.add("run-1", shape)
        replaced = traces(pool._by_key["run-1"])
        pool.add("run-1", shape)
        assert pool.keys() == ["run-1"]
        assert_gone(replaced)
        oldest = traces(pool._by_key["run-1"])
        pool.add("run-2", shape)
        pool.add("run-3", shape)
        assert sorted(pool.keys()) == ["run-2", "run-3"]
        assert_gone(oldest)
    finally:
        pool.discard()
    assert pool.keys() == []


WARMED_FIRST_REQUEST = """
import asyncio, json, ssl, sys
sys.path.insert(0, GUEST_DIR)
import _artweb_guest as guest

guest.warm_up()
from artweb_sdk import TrainableModel
from artweb_sdk.model import Endpoint

contexts = []
create_default_context = ssl.create_default_context
ssl.create_default_context = lambda *a, **k: contexts.append(1) or create_default_context(*a, **k)
REPLY = json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": "m", "choices": [
    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}]}).encode()

async def answer(reader, writer):
    await reader.readuntil(b"\\r\\n\\r\\n")
    writer.write(b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\nConnection: close\\r\\n"
                 b"Content-Length: %d\\r\\n\\r\\n%s" % (len(REPLY), REPLY))
    await writer.drain()
    writer.close()

async def main():
    server = await asyncio.start_unix_server(answer, SOCKET)
    before = set(sys.modules)
    model = TrainableModel(name="m", _endpoint=Endpoint(base_url="http://127.0.0.1:9/v1", socket_path=SOCKET))
    await model.openai_client().chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    server.close()
    return sorted(set(sys.modules) - before)

print(json.dumps({"imported": asyncio.run(main()), "tls_contexts": len(contexts)}))
"""


def test_the_warm_up_leaves_the_first_chat_completion_nothing_to_import_or_build(tmp_path):
    # A pre-started sandbox imports before its batch, off the step's clock; what the batch's first request
    # still imports (the connection backend) or builds (a TLS context from the CA bundle) is on it.
    code = f"GUEST_DIR = {str(mounts.GUEST_DIR)!r}\nSOCKET = {str(tmp_path / 's.sock')!r}\n" + WARMED_FIRST_REQUEST
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    libraries = ("anyio", "httpcore", "httpx", "h11", "openai", "artweb_sdk")
    assert [m for m in seen["imported"] if m.split(".")[0] in libraries] == []
    assert seen["tls_contexts"] == 0
