"""A kernel uid of its own for each live jailed batch on a host, leased from the operator's range
(ARTWEB_SANDBOX_UIDS) and given back when the batch ends.

Why: the kernel keeps state per uid that no namespace separates: the pipe-buffer quota
(fs.pipe-user-pages-soft), inotify instances and watches, RLIMIT_NPROC and RLIMIT_MSGQUEUE counts, the
user keyring and its quota, and the permission to signal or trace a process. Batches of one uid could
read each other's keys, exhaust each other's quotas (a denial of service, and a channel between tenants)
or, with a pid namespace bug, signal each other. With a uid each, none of that is shared.

How the lease holds across worker processes: one lock file per uid in a directory only root may write
(ARTWEB_SANDBOX_UID_LOCKS); a batch holds an exclusive flock(2) on its uid's file as long as it lives.
An flock belongs to the open file, so two batches of one process exclude each other as two processes do,
and the kernel drops it when its holder dies, however it dies. A uid is leased only when no process on
the host runs as it (checked in /proc once its lock is held), so what a killed worker's batch left
running keeps its uid out of use until it is gone. (A batch gives its uid back after its cgroup was
emptied, so nothing of it is left then.)
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

from rollouts.sandbox import JailUnavailable

DEFAULT_UIDS = range(64000, 65000)
DEFAULT_LOCK_DIR = "/run/artweb-sandbox-uids"


def uid_range(text: str) -> range:
    """ARTWEB_SANDBOX_UIDS's value, "FIRST-LAST" (both included) or one uid, as a range."""
    first, sep, last = text.strip().partition("-")
    try:
        uids = range(int(first), int(last if sep else first) + 1)
    except ValueError:
        uids = range(0)
    if not uids or uids.start < 1 or uids.stop > 1 << 31:
        raise JailUnavailable(
            f"ARTWEB_SANDBOX_UIDS={text!r} is not a range of uids; write it as FIRST-LAST, e.g. 64000-64999 "
            "(one uid per batch running at once on this host, none of them an account's)."
        )
    return uids


def uids_in_use() -> set[int]:
    """Every uid a live process of this host (of this pid namespace) runs as: real, effective, saved or
    filesystem. A zombie does not count: it has exited and holds nothing of its uid's but its pid, which
    its parent (not the batch) reaps."""
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as fh:
                for line in fh:
                    if line.startswith(b"State:") and line.split()[1] in (b"Z", b"X"):
                        break
                    if line.startswith(b"Uid:"):
                        found.update(int(v) for v in line.split()[1:5])
                        break
        except (OSError, ValueError, IndexError):  # exited meanwhile
            continue
    return found


class UidLease:
    """A uid held for one batch; release() gives it back (idempotent)."""

    def __init__(self, uid: int, fd: int) -> None:
        self.uid = uid
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _lock_dir(path: str) -> Path:
    d = Path(path)
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = d.lstat()
    except OSError as exc:
        raise JailUnavailable(f"ARTWEB_SANDBOX_UID_LOCKS={path} cannot be created ({exc}).") from exc
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise JailUnavailable(
            f"ARTWEB_SANDBOX_UID_LOCKS={path} must be a directory of the worker's user that nobody else may "
            "write: the sandbox uid leases are kept there."
        )
    return d


def uid_lease(uids: range, lock_dir: str = DEFAULT_LOCK_DIR) -> UidLease:
    """Lease the first uid of `uids` that no other batch holds and no process runs as.

    Raises JailUnavailable, naming the setting, when every uid of the range is taken."""
    d = _lock_dir(lock_dir)
    for uid in uids:
        fd = os.open(d / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        # Read with the lock held: a batch that held this uid until a moment ago has left processes seen now
        # or none at all.
        if uid in uids_in_use():
            os.close(fd)
            continue
        return UidLease(uid, fd)
    raise JailUnavailable(
        f"No sandbox uid is free: all {len(uids)} uids of ARTWEB_SANDBOX_UIDS ({uids.start}-{uids.stop - 1}) "
        "are held by batches running on this host or by processes still running as them. Widen the range "
        "(one uid per batch running at once, pre-started ones included) or run fewer batches at once."
    )
