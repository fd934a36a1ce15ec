"""The batch's cgroup: its memory, process and CPU budget, written when the jail is built and joined by
each sandbox process before it execs bubblewrap (see rollouts.sandbox.jail)."""

from __future__ import annotations

import logging
import os
import signal
import time
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from rollouts.sandbox import JailUnavailable

if TYPE_CHECKING:
    from rollouts.sandbox.jail import JailLimits

logger = logging.getLogger(__name__)

CGROUP_NAME = "artweb-sandbox"


class Cgroup:
    """The batch's cgroup: limits written at creation, joined by each sandbox process before exec."""

    def __init__(self, dirs: dict[str, Path], v2: bool) -> None:
        self.dirs = dirs  # controller -> directory ("unified" for v2)
        self.v2 = v2

    @classmethod
    def create(cls, name: str, limits: JailLimits, parent: str) -> Cgroup:
        layout = cgroup_layout(parent)
        if layout["v2"]:
            d = Path(layout["unified"]) / name
            d.mkdir(mode=0o700)
            group = cls({"unified": d}, True)
            _write(d / "memory.max", limits.memory_mb << 20)
            _write_try(d / "memory.swap.max", 0)
            _write(d / "pids.max", limits.processes)
            _write(d / "cpu.max", f"{int(limits.cpus * 100_000)} 100000")
            return group
        dirs = {c: Path(layout[c]) / name for c in ("memory", "pids", "cpu")}
        for d in dirs.values():
            d.mkdir(mode=0o700)
        group = cls(dirs, False)
        _write(dirs["memory"] / "memory.limit_in_bytes", limits.memory_mb << 20)
        # Without this, memory over the limit goes to swap instead of failing.
        _write_try(dirs["memory"] / "memory.memsw.limit_in_bytes", limits.memory_mb << 20)
        _write(dirs["pids"] / "pids.max", limits.processes)
        _write(dirs["cpu"] / "cpu.cfs_period_us", 100_000)
        _write(dirs["cpu"] / "cpu.cfs_quota_us", int(limits.cpus * 100_000))
        return group

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.procs_files():
            try:
                found.update(int(line) for line in Path(path).read_text().split())
            except OSError:
                pass
        return found

    def oom_kills(self) -> int:
        """How many processes the kernel killed for the batch's memory limit."""
        d = self.dirs.get("unified") or self.dirs["memory"]
        name = "memory.events" if self.v2 else "memory.oom_control"
        try:
            for line in (d / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        try:  # older kernels: v1 counts hitting the limit, not kills
            return int((d / "memory.failcnt").read_text()) if not self.v2 else 0
        except (OSError, ValueError):
            return 0

    def renice(self, nice: int = 0) -> None:
        """Every thread in the cgroup to the normal scheduling class at CPU priority `nice` (both are a
        thread's own in Linux)."""
        for pid in self.pids():
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:  # exited meanwhile
                continue
            for tid in tids:
                try:
                    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                    os.setpriority(os.PRIO_PROCESS, tid, nice)
                except OSError:
                    pass

    def kill_all(self, wait_s: float = 10.0) -> None:
        """SIGKILL whatever is left in the cgroup (the pid namespace's end normally took it already) and
        wait until it is gone. A killed process still needs the CPU to exit: one of the idle class (a
        pre-started batch) gets next to none on busy cores, so it goes back to the normal class first."""
        self.renice(0)
        if self.v2:
            _write_try(self.dirs["unified"] / "cgroup.kill", 1)
        deadline = time.monotonic() + wait_s
        # A process that has just exited (the batch's last bwrap, freeing its seccomp filter) is usually
        # gone within a millisecond or two: look again soon, then every 20 ms at most.
        delay = 0.001
        while time.monotonic() < deadline:
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(delay)
            delay = min(2 * delay, 0.02)
        logger.warning("processes %s of sandbox cgroup %s outlived SIGKILL for %.0f s", sorted(pids), self.dirs, wait_s)

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs.values():
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # busy for a moment while the last processes are reaped
                    time.sleep(0.02)


def _write(path: Path, value) -> None:
    path.write_text(f"{value}\n")


def _write_try(path: Path, value) -> None:
    try:
        _write(path, value)
    except OSError:
        pass


@cache
def cgroup_layout(explicit: str) -> dict:
    """Where the batch cgroups go: a parent named CGROUP_NAME under each controller's hierarchy.

    `explicit` names a cgroup v2 directory the worker may write (a delegated subtree with the memory,
    pids and cpu controllers enabled for its children); empty: the host's hierarchy is used.
    """
    mounts = _cgroup_mounts()
    if explicit:
        parent = Path(explicit)
        _require_v2_controllers(parent)
        return {"v2": True, "unified": str(parent)}
    v1 = {c: mounts.get(c) for c in ("memory", "pids", "cpu")}
    if all(v1.values()):
        layout = {"v2": False}
        for controller, mount in v1.items():
            parent = Path(mount) / CGROUP_NAME
            parent.mkdir(mode=0o700, exist_ok=True)
            layout[controller] = str(parent)
        return layout
    root = mounts.get("cgroup2")
    if root is None:
        raise JailUnavailable(
            "No cgroup hierarchy with the memory, pids and cpu controllers is mounted; the sandbox needs "
            "one for its batch-wide limits. Mount cgroup2 at /sys/fs/cgroup (or the v1 controllers)."
        )
    parent = Path(root) / CGROUP_NAME
    parent.mkdir(mode=0o700, exist_ok=True)
    wanted = {"memory", "pids", "cpu"}
    available = set((Path(root) / "cgroup.controllers").read_text().split())
    if not wanted <= available:
        raise JailUnavailable(
            f"The cgroup v2 hierarchy at {root} lacks the {', '.join(sorted(wanted - available))} "
            "controller(s) the sandbox needs."
        )
    try:
        _write(Path(root) / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(wanted)))
        _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(wanted)))
    except OSError as exc:
        raise JailUnavailable(
            f"Cannot enable the memory, pids and cpu controllers under {parent} ({exc}). In a container the "
            "worker's cgroup usually holds processes, which cgroup v2 forbids for a parent of limited groups: "
            "give the worker a delegated cgroup and name it in ARTWEB_SANDBOX_CGROUP."
        ) from exc
    return {"v2": True, "unified": str(parent)}


def _require_v2_controllers(parent: Path) -> None:
    try:
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
    except OSError as exc:
        raise JailUnavailable(f"ARTWEB_SANDBOX_CGROUP={parent} is not a cgroup v2 directory ({exc}).") from exc
    missing = {"memory", "pids", "cpu"} - enabled
    if missing:
        raise JailUnavailable(
            f"ARTWEB_SANDBOX_CGROUP={parent}: enable {', '.join(sorted(missing))} in its cgroup.subtree_control."
        )
    if not os.access(parent, os.W_OK):
        raise JailUnavailable(f"ARTWEB_SANDBOX_CGROUP={parent} is not writable by this worker.")


def _cgroup_mounts() -> dict[str, str]:
    mounts: dict[str, str] = {}
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return mounts
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        where, fstype, options = fields[1], fields[2], fields[3].split(",")
        if fstype == "cgroup2":
            mounts.setdefault("cgroup2", where)
        elif fstype == "cgroup":
            for controller in ("memory", "pids", "cpu"):
                if controller in options:
                    mounts.setdefault(controller, where)
    return mounts
