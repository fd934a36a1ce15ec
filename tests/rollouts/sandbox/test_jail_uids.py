"""A kernel uid of its own for each live batch: two batches at once never share one, so nothing the kernel
keeps per uid (quotas, keyrings, the right to signal) passes between them; the lease holds across
worker processes and is never given to a new batch while a process of the uid lives.

The batches run in the real jail. The uids are read from the host's /proc, where the kernel's own uids
show (inside, every batch is uid 1000 of its user namespace): each hostile process renames itself so
that the test finds exactly it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from rollouts.sandbox import Cancelled
from rollouts.sandbox.batch import SandboxLimits
from rollouts.sandbox.jail import JailConfig, JailUnavailable, jail_check
from rollouts.sandbox.rollouts import run_rollouts
from tests.rollouts.sandbox.scripts import script
from tests.rollouts.sandbox.test_hostile import named, rename, report

# Uids no other test leases (the default range starts at 64000), so concurrent runs cannot take them. (The
# lease's module is imported in the tests that use it, so that the hostile tests also run on code without it.)
SPARE = range(65100, 65110)


def real_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


def wait_named(comm: str, timeout_s: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pids := named(comm):
            return pids
        time.sleep(0.05)
    raise AssertionError(f"no process named {comm} appeared")


@pytest.mark.skipif(
    int(Path("/proc/sys/fs/pipe-user-pages-soft").read_text()) == 0, reason="this host sets no per-user pipe quota"
)
@pytest.mark.slow
def test_concurrent_batches_run_as_different_uids_and_share_no_quota(request_for):
    """Batch A uses up its uid's pipe-buffer quota (fs.pipe-user-pages-soft: capacity only, no memory) and
    holds it; batch B, running meanwhile, must still get full-size pipes and another kernel uid."""
    tag = uuid.uuid4().hex[:8]
    hog = (
        rename(f"hog{tag}") + "import fcntl\n"
        "held = []\n"
        "while True:\n"
        "    r, w = os.pipe()\n"
        "    held.append((r, w))\n"
        "    if fcntl.fcntl(w, 1032) < 65536:  # F_GETPIPE_SZ: over the uid's quota, new pipes get 2 pages\n"
        "        break\n"
        "    try:\n"
        "        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ: 256 pages of the quota at a time\n"
        "    except PermissionError:\n"
        "        pass\n"
        "    if len(held) > 4000:\n"
        "        raise RuntimeError('no pipe quota reached')\n" + rename(f"full{tag}") + "await asyncio.sleep(120)\n"
    )
    stop = threading.Event()
    outcome = {}

    def run_hog():
        try:
            run_rollouts(request_for(script(hog), scenarios=[{"i": 0}], group_size=1), should_stop=stop.is_set)
        except Cancelled:
            outcome["hog"] = "cancelled"

    hogger = threading.Thread(target=run_hog)
    hogger.start()
    try:
        (hog_pid,) = wait_named(f"full{tag}")  # its quota is used up, and it holds it
        hog_uid = real_uid(hog_pid)
        probe = (
            rename(f"probe{tag}") + "import fcntl\n"
            "r, w = os.pipe()\n"
            "out['pipe_bytes'] = fcntl.fcntl(w, 1032)\n"
            "out['uid_inside'] = os.getuid()\n"
            "import time\n"
            "time.sleep(1)\n"  # for the test to read its uid from outside
        )
        seen: dict[int, int] = {}
        watching = threading.Event()

        def watch():
            while not watching.wait(0.05):
                for pid in named(f"probe{tag}"):
                    try:
                        seen[pid] = real_uid(pid)
                    except (OSError, AssertionError):
                        pass

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            results = run_rollouts(request_for(report(probe)))
        finally:
            watching.set()
            watcher.join()
    finally:
        stop.set()
        hogger.join(60)
    out = results[0].trajectories[0]["metadata"]
    assert outcome == {"hog": "cancelled"}
    assert seen, "the probe's process was never seen"
    assert hog_uid not in set(seen.values()), (hog_uid, seen)
    assert out == {"pipe_bytes": 65536, "uid_inside": 1000}  # a full pipe; the same uid inside either way
    assert [t["reward"] for t in results[1].trajectories] == [1.0, 1.0]


def test_a_batch_fails_naming_the_setting_when_no_uid_is_free(request_for):
    one = JailConfig(uids=range(SPARE.start, SPARE.start + 1))
    tag = uuid.uuid4().hex[:8]
    stop = threading.Event()
    outcome = {}

    def hold():
        try:
            run_rollouts(
                request_for(script(rename(f"hold{tag}") + "await asyncio.sleep(60)"), jail=one), should_stop=stop.is_set
            )
        except Cancelled:
            outcome["holder"] = "cancelled"

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        wait_named(f"hold{tag}")
        with pytest.raises(JailUnavailable, match=r"No sandbox uid is free.*ARTWEB_SANDBOX_UIDS \(65100-65100\)"):
            run_rollouts(request_for(script("pass"), jail=one))
    finally:
        stop.set()
        holder.join(60)
    assert outcome == {"holder": "cancelled"}
    # Given back with its batch: the next batch gets it.
    results = run_rollouts(request_for(script("pass"), jail=one, limits=SandboxLimits(rollout_timeout_s=20)))
    assert [t["reward"] for g in results for t in g.trajectories] == [1.0] * 4


def test_a_lease_holds_across_processes_and_ends_with_its_holder(tmp_path):
    from rollouts.sandbox.uid_lease import uid_lease

    locks = str(tmp_path / "locks")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from rollouts.sandbox.uid_lease import uid_lease
                lease = uid_lease(range({SPARE.start}, {SPARE.stop}), {locks!r})
                print(lease.uid, flush=True)
                time.sleep(60)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert int(holder.stdout.readline()) == SPARE.start
        mine = uid_lease(SPARE, locks)
        assert mine.uid == SPARE.start + 1  # another process holds the first
        mine.release()
    finally:
        holder.kill()  # no release: the kernel drops the lock with the process
        holder.wait()
    again = uid_lease(SPARE, locks)
    assert again.uid == SPARE.start
    again.release()


def test_it_leases_no_uid_that_a_process_still_runs_as(tmp_path):
    """What a batch left running (its worker was killed, say) keeps its uid out of use until it is gone."""
    from rollouts.sandbox.uid_lease import uid_lease, uids_in_use

    locks = str(tmp_path / "locks")
    survivor = subprocess.Popen(["sleep", "60"], user=SPARE.start, group=SPARE.start)
    try:
        deadline = time.monotonic() + 10
        while SPARE.start not in uids_in_use() and time.monotonic() < deadline:
            time.sleep(0.01)
        lease = uid_lease(SPARE, locks)
        assert lease.uid == SPARE.start + 1
        lease.release()
    finally:
        survivor.kill()
        survivor.wait()
    lease = uid_lease(SPARE, locks)  # once it is gone, the uid is free again
    assert lease.uid == SPARE.start
    lease.release()


def test_it_reads_the_uid_range_setting():
    from rollouts.sandbox.uid_lease import uid_range

    assert uid_range("64000-64999") == range(64000, 65000)
    assert uid_range(" 64000 ") == range(64000, 64001)  # the deprecated ARTWEB_SANDBOX_UID: one uid
    for bad in ("", "64000-", "x-y", "65000-64000", "0-10", "-5"):
        with pytest.raises(JailUnavailable, match="ARTWEB_SANDBOX_UIDS"):
            uid_range(bad)


def test_it_refuses_a_range_that_holds_root_the_worker_or_an_account():
    import pwd

    nobody = pwd.getpwnam("nobody").pw_uid
    with pytest.raises(JailUnavailable, match="root or the worker's own uid"):
        jail_check(JailConfig(uids=range(10)), sys.executable)
    with pytest.raises(JailUnavailable, match=f"uid {nobody} of the account 'nobody'"):
        jail_check(JailConfig(uids=range(nobody - 1, nobody + 1)), sys.executable)


def test_a_lock_directory_others_may_write_is_refused(tmp_path):
    from rollouts.sandbox.uid_lease import uid_lease

    locks = tmp_path / "locks"
    locks.mkdir(mode=0o777)
    locks.chmod(0o777)
    with pytest.raises(JailUnavailable, match="ARTWEB_SANDBOX_UID_LOCKS"):
        uid_lease(SPARE, str(locks))
    assert os.listdir(locks) == []
