"""The jail around user code: bubblewrap for the namespaces and the filesystem view, cgroups for the
batch's memory, process and CPU budget.

Why bubblewrap: it is the small, audited tool Flatpak builds its sandboxes on, packaged by every
distribution, starts a jail in ~10 ms, and needs no daemon or setuid bit when the caller may create
user namespaces. It does namespaces and mounts only, so the batch-wide limits are cgroups set up here.
(nsjail does both, but no Debian release packages it.)

Each sandbox process of a batch runs as

    worker (root) ─ fork ─ join the batch's cgroups, rlimits, drop to the batch's uid, no_new_privs
                   └ exec bwrap: new user, pid, mount, ipc, uts, cgroup and network namespaces,
                                 no capabilities, no nested user namespaces, a new session,
                                 the seccomp filter (rollouts.runtime.seccomp)
                     └ python guest: sees /usr, the interpreter, the SDK, its batch's files (read-only),
                                     a private size-limited /tmp and /dev/shm, a /proc of its own
                                     pid namespace, and one unix socket: the inference proxy.

The batch's uid is neither root nor the worker's, so the host's permission checks stop anything that
leaks through a mount, and no other live batch of the host has it (rollouts.runtime.uid_lease), so no
quota, keyring or signal is shared between batches. The network namespace holds only a loopback
interface: no PostgreSQL, Redis, vLLM or anything else. When the batch ends, killing bwrap kills the
namespace's init and with it every process of the namespace, whatever it forked or re-parented; the
cgroup is then swept and removed, and the uid given back.

What the jail's /proc/self/mountinfo shows of the host: /usr and the base interpreter's directory
(bound where they are: a virtualenv's pyvenv.cfg and symlinks name it) and the batch's work directory
(a random name under the worker's TMPDIR). Everything bound at a path of the jail's own (the
virtualenv, the SDK) is mounted through a read-only overlay of a staging name, so neither its host path
nor its filesystem's layout shows; the data dir and the project checkout are never mounted.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import pwd
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from rollouts.runtime import seccomp
from rollouts.runtime.uid_lease import DEFAULT_LOCK_DIR, DEFAULT_UIDS, uid_lease, uid_range

logger = logging.getLogger(__name__)

# Paths inside the jail.
GUEST_ROOT = "/opt/artweb"  # the SDK and the guest program
VENV_INSIDE = f"{GUEST_ROOT}/python"  # the sandbox interpreter's virtualenv, if it is one
BATCH_DIR = "/batch"  # the batch's own files, read-only
SOCKET_DIR = "/run/artweb"  # the inference proxy's socket
SCRATCH = "/tmp"  # the only writable place (and /dev/shm)
INSIDE_UID = 1000  # the uid user code sees; outside it is the batch's leased uid

CGROUP_NAME = "artweb-sandbox"
OPT_OUT = "insecure-no-jail"  # ARTWEB_SANDBOX's value for the development opt-out


class JailUnavailable(RuntimeError):
    """The jail cannot be built on this machine; the message says what the operator must install or enable."""


@dataclass(frozen=True)
class JailConfig:
    """How user code is isolated on this worker (from the settings: ARTWEB_SANDBOX*)."""

    mode: str = "jail"  # "jail", or OPT_OUT: plain subprocesses, for development only
    # The uids user code runs as outside its user namespace, one per batch running at once on the host
    # (ARTWEB_SANDBOX_UIDS): no account's, not root, not the worker's.
    uids: range = DEFAULT_UIDS
    cgroup_parent: str = ""  # a delegated cgroup v2 directory; empty: the host's hierarchy
    # Where the uid leases are held (ARTWEB_SANDBOX_UID_LOCKS): one directory for every worker of the host.
    uid_locks: str = DEFAULT_LOCK_DIR

    def __post_init__(self) -> None:
        if self.mode not in ("jail", OPT_OUT):
            raise JailUnavailable(f"ARTWEB_SANDBOX={self.mode!r} is not a sandbox mode; use 'jail' or '{OPT_OUT}'.")
        if not isinstance(self.uids, range) or not self.uids:
            raise JailUnavailable(f"The sandbox uids {self.uids!r} are not a non-empty range (ARTWEB_SANDBOX_UIDS).")

    @property
    def jailed(self) -> bool:
        return self.mode == "jail"


@dataclass(frozen=True)
class JailLimits:
    memory_mb: int  # resident memory of every process of the batch together (cgroup), tmpfs included
    processes: int  # processes and threads of the batch together (cgroup pids)
    cpus: float  # CPU cores the batch may use at once (cgroup CPU quota)
    scratch_mb: int = 256  # size of the private /tmp
    shm_mb: int = 64  # size of the private /dev/shm


# --- cgroups --------------------------------------------------------------------------------------------


class _Cgroup:
    """The batch's cgroup: limits written at creation, joined by each sandbox process before exec."""

    def __init__(self, dirs: dict[str, Path], v2: bool) -> None:
        self.dirs = dirs  # controller -> directory ("unified" for v2)
        self.v2 = v2

    @classmethod
    def create(cls, name: str, limits: JailLimits, parent: str) -> _Cgroup:
        layout = _cgroup_layout(parent)
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
def _cgroup_layout(explicit: str) -> dict:
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


# --- what the jail may see ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interpreter:
    """How the jail holds the sandbox interpreter."""

    binds: tuple[tuple[str, str], ...]  # (host directory, path in the jail)
    python: str  # the interpreter's path in the jail


@cache
def interpreter(python: str) -> Interpreter:
    """The directories `python` needs: a virtualenv goes to VENV_INSIDE (its host path, often inside the
    project checkout, stays hidden), its base installation and the executable's home where they are
    (the virtualenv's pyvenv.cfg and symlinks name them); /usr is mounted whole anyway."""
    code = (
        "import json, os, sys; print(json.dumps([sys.prefix, sys.base_prefix, "
        "[sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]]))"
    )
    probe = subprocess.run(
        [python, "-I", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0:
        raise JailUnavailable(f"The sandbox interpreter {python} does not start: {probe.stderr.strip()[-500:]}")
    prefix, base, others = json.loads(probe.stdout)
    binds: dict[str, str] = {}
    inside = python
    absolute = os.path.abspath(python)
    if prefix != base and absolute.startswith(prefix.rstrip("/") + "/"):
        binds[os.path.realpath(prefix)] = VENV_INSIDE
        inside = f"{VENV_INSIDE}/{os.path.relpath(absolute, prefix)}"
    else:
        others.append(prefix)
    # /usr is mounted whole, and a directory inside another one bound needs no mount of its own.
    kept: list[str] = ["/usr", *binds]
    for path in sorted({os.path.realpath(p) for p in [base, *others]}, key=len):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
            binds[path] = path
    return Interpreter(tuple(binds.items()), inside)


def _system_mounts() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for name in ("ld.so.cache", "ld.so.conf", "localtime", "nsswitch.conf"):
        if os.path.exists(f"/etc/{name}"):
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    return args


def etc_files(batch_dir: Path) -> list[str]:
    """A passwd, group and hosts of the jail's own: no host accounts, `localhost` only."""
    etc = batch_dir / "etc"
    etc.mkdir(exist_ok=True)
    etc.chmod(0o755)
    files = {
        "passwd": f"sandbox:x:{INSIDE_UID}:{INSIDE_UID}:sandbox:{SCRATCH}:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"sandbox:x:{INSIDE_UID}:\nnogroup:x:65534:\n",
        "hosts": "127.0.0.1 localhost\n::1 localhost\n",
    }
    args = []
    for name, text in files.items():
        (etc / name).write_text(text)
        (etc / name).chmod(0o644)
        args += ["--ro-bind", str(etc / name), f"/etc/{name}"]
    return args


# --- the jail -------------------------------------------------------------------------------------------


BWRAP_FALLBACKS = ("/usr/bin/bwrap", "/usr/local/bin/bwrap")  # a worker's PATH may be trimmed


@cache
def bwrap_path() -> str:
    path = shutil.which("bwrap") or next((p for p in BWRAP_FALLBACKS if os.path.exists(p)), None)
    if path is None:
        raise JailUnavailable(
            "bubblewrap (bwrap) is not installed; the rollout sandbox needs it to run user code. Install it "
            "(Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap). On a development "
            f"machine only, ARTWEB_SANDBOX={OPT_OUT} runs user code without the jail."
        )
    return path


_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: nothing may be loaded between fork and exec
_CLONE_NEWNS = 0x00020000
_MS_RDONLY, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x1, 0x1000, 0x4000, 0x40000


def _sources(python: str, guest_dir: Path, fallbacks_dir: Path) -> dict[str, str]:
    """Host directory → where the jail sees it: the interpreter's (see interpreter()), the SDK under GUEST_ROOT."""
    found = dict(interpreter(python).binds)
    found[str(guest_dir)] = f"{GUEST_ROOT}/guest"
    found[str(fallbacks_dir)] = f"{GUEST_ROOT}/guest_fallbacks"
    return found


def _stage(stage_dir: Path, sources: dict[str, str]) -> list[tuple[str, str, str]]:
    """(host path, staging path, jail path) for each source.

    bwrap runs as the sandbox uid, which may not pass through the directories above a source (a
    virtualenv in a private home). So each source is bind-mounted on a staging directory the uid can
    reach, by the child, as root, in a mount namespace of its own (nothing shows on the host), and
    bwrap binds it from there.

    A source the jail sees at a path of its own (the SDK, a virtualenv) is bound on `<staging>.src`
    instead, and `<staging>` is a read-only overlay of it: a bind mount shows, in the jail's
    /proc/self/mountinfo, its directory's path inside its filesystem, the host path; an overlay shows
    its own root and the staging names it was given.
    """
    staged = []
    for i, (host, inside) in enumerate(sources.items()):
        d = stage_dir / str(i)
        d.mkdir(parents=True, exist_ok=True)
        if host != inside:
            (stage_dir / f"{i}.src").mkdir(exist_ok=True)
        staged.append((host, str(d), inside))
    (stage_dir / "empty").mkdir(exist_ok=True)  # an overlay needs two layers when none is writable
    for d in (stage_dir, *stage_dir.iterdir()):
        d.chmod(0o755)  # explicit: the worker's umask (077) would leave them closed to the sandbox uid
    return staged


def _bwrap_args(staged: list[tuple[str, str, str]], scratch_mb: int = 256) -> list[str]:
    args = [
        bwrap_path(),
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--uid",
        str(INSIDE_UID),
        "--gid",
        str(INSIDE_UID),
        "--hostname",
        "sandbox",
        *_system_mounts(),
        # The scratch before the interpreter: a virtualenv that lives under /tmp on the host is then
        # bound on top of the jail's /tmp instead of vanishing under it.
        "--size",
        str(scratch_mb << 20),
        "--tmpfs",
        SCRATCH,
    ]
    for _, staging, inside in staged:
        args += ["--ro-bind", staging, inside]
    return args


def _child_setup(
    *,
    staged: list[tuple[str, str, str]],
    uid: int,
    procs: list[str],
    cpu_seconds: int,
    file_mb: int,
    address_space_mb: int | None = None,
    nice: int = 0,
) -> Callable[[], None]:
    """What the child does between fork and exec, as root: join the batch's cgroups, set rlimits and the
    CPU priority (`nice` > 0: that nice value under the idle scheduling class, see Jail.preexec), stage
    the sources (see _stage), then become the sandbox uid for good.

    Only raw system calls here (open/write, setrlimit, unshare/mount through libc, set*id): no imports
    or locks that another thread of the worker could hold at fork time.
    """
    mounts = []  # (host, where it is bound, overlay options or None)
    for host, staging, inside in staged:
        if host == inside:
            mounts.append((host.encode(), staging.encode(), None))
        else:
            empty = str(Path(staging).parent / "empty")
            mounts.append((host.encode(), f"{staging}.src".encode(), f"lowerdir={staging}.src:{empty}".encode()))

    def fail(what: str) -> None:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")

    def apply() -> None:
        for path in procs:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0\n")  # "0": the writing process itself
            finally:
                os.close(fd)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20, file_mb << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if address_space_mb:
            # One process asking for more than the whole batch may have gets a MemoryError at once,
            # rather than the kernel's kill when the batch's pages run out.
            resource.setrlimit(resource.RLIMIT_AS, (address_space_mb << 20, address_space_mb << 20))
        if nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        if _LIBC.unshare(_CLONE_NEWNS) != 0:
            fail("unshare(CLONE_NEWNS)")
        if _LIBC.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
            fail("making the mounts private")
        for host, where, overlay in mounts:
            if _LIBC.mount(host, where, None, _MS_BIND | _MS_REC, None) != 0:
                fail("staging a bind mount")
            if overlay is not None:
                target = where[: -len(b".src")]
                # Where no overlay can be mounted (no overlayfs, or filesystems stacked too deep in nested
                # containers), a bind mount instead: the jail works, only its mountinfo shows the host path.
                if _LIBC.mount(b"overlay", target, b"overlay", _MS_RDONLY, overlay) != 0:
                    if _LIBC.mount(where, target, None, _MS_BIND | _MS_REC, None) != 0:
                        fail("staging a bind mount")
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)

    return apply


def _check_uids(uids: range) -> None:
    """The uid range is the jail's alone: not root, not the worker's, no account's."""
    setting = f"ARTWEB_SANDBOX_UIDS={uids.start}-{uids.stop - 1}"
    if 0 in uids or os.getuid() in uids:
        raise JailUnavailable(f"{setting} includes root or the worker's own uid; choose uids nobody uses.")
    taken = sorted((p.pw_uid, p.pw_name) for p in pwd.getpwall() if p.pw_uid in uids)
    if taken:
        raise JailUnavailable(
            f"{setting} includes the uid {taken[0][0]} of the account {taken[0][1]!r}; user code must run as "
            "uids no account or service of this host uses. Choose another range."
        )


@cache
def jail_check(config: JailConfig, python: str) -> None:
    """Raise JailUnavailable, saying what to do, unless a jail that runs `python` can be built here.

    Cached per process: the probe (a jail that imports the SDK's dependencies) takes about a second.
    """
    if os.geteuid() != 0:
        raise JailUnavailable(
            "The rollout sandbox must be started by a worker running as root: it switches user code to "
            "unprivileged uids of its own (ARTWEB_SANDBOX_UIDS) and sets up cgroups for the batch's limits. "
            "Run the GPU worker as root in its container (the Docker image does), or, on a development "
            f"machine only, set ARTWEB_SANDBOX={OPT_OUT}."
        )
    _check_uids(config.uids)
    bwrap_path()
    seccomp.filter_program()
    _cgroup_layout(config.cgroup_parent)
    here = Path(__file__).resolve().parent
    lease = uid_lease(config.uids, config.uid_locks)
    filter_fd = seccomp.filter_fd()
    try:
        with tempfile.TemporaryDirectory(prefix="artweb-jail-probe-") as tmp:
            Path(tmp).chmod(0o711)
            staged = _stage(Path(tmp) / "stage", _sources(python, here / "guest", here / "guest_fallbacks"))
            probe = subprocess.run(
                [
                    *_bwrap_args(staged),
                    "--proc",
                    "/proc",
                    "--dev",
                    "/dev",
                    "--seccomp",
                    str(filter_fd),
                    "--",
                    interpreter(python).python,
                    "-I",
                    "-c",
                    "import openai, httpx",
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
                env={"PATH": "/usr/bin:/bin"},
                pass_fds=(filter_fd,),
                preexec_fn=_child_setup(staged=staged, uid=lease.uid, procs=[], cpu_seconds=120, file_mb=64),
            )
    finally:
        os.close(filter_fd)
        lease.release()
    if probe.returncode != 0:
        raise JailUnavailable(
            f"The rollout sandbox's jail does not start here: {probe.stderr.strip()[-500:]}. bubblewrap needs "
            "unprivileged user namespaces (sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1 "
            "where it exists; on Ubuntu 24.04 also kernel.apparmor_restrict_unprivileged_userns=0), a container "
            "needs them allowed by its seccomp/AppArmor profile (see docker/docker-compose.yml), and the sandbox "
            f"interpreter {python} needs openai and httpx installed."
        )


class Jail:
    """The jail of one batch: its uid, its cgroup, and the bwrap command line for each sandbox process."""

    def __init__(
        self,
        *,
        config: JailConfig,
        root: Path,
        socket_dir: Path,
        guest_dir: Path,
        fallbacks_dir: Path,
        python: str,
        limits: JailLimits,
    ) -> None:
        """root: the batch's directory (mode 0711); each sandbox's files are in root/shared/<name>.

        Raises JailUnavailable when the jail cannot be built here or no sandbox uid is free."""
        jail_check(config, python)
        self.limits = limits
        self.root = root
        self.socket_dir = socket_dir
        self.python = interpreter(python).python  # the interpreter's path inside the jail
        self.staged = _stage(root / "stage", _sources(python, guest_dir, fallbacks_dir))
        self.etc = etc_files(root / "shared")
        self._lease = uid_lease(config.uids, config.uid_locks)
        self.uid = self._lease.uid  # the batch's own, outside its user namespace
        try:
            self.cgroup = _Cgroup.create(f"batch-{uuid.uuid4().hex[:12]}", limits, config.cgroup_parent)
        except BaseException:
            self._lease.release()
            raise

    def command(self, files_dir: Path, argv: list[str], *, seccomp_fd: int) -> list[str]:
        """bwrap + argv, with files_dir at BATCH_DIR and the working directory SCRATCH.

        seccomp_fd: a descriptor from seccomp.filter_fd(), one per process: pass it to the process
        (pass_fds) and close it once the process has started."""
        return [
            *_bwrap_args(self.staged, self.limits.scratch_mb),
            "--ro-bind",
            str(files_dir),
            BATCH_DIR,
            "--ro-bind",
            str(self.socket_dir),
            SOCKET_DIR,
            *self.etc,
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            str(self.limits.shm_mb << 20),
            "--tmpfs",
            "/dev/shm",
            # bwrap builds the jail's root on a tmpfs; once everything is mounted, it is read-only.
            "--remount-ro",
            "/",
            "--chdir",
            SCRATCH,
            "--seccomp",
            str(seccomp_fd),
            "--",
            *argv,
        ]

    def preexec(self, *, cpu_seconds: int, file_mb: int, nice: int = 0) -> Callable[[], None]:
        """`nice` > 0 starts the processes at the lowest CPU priority there is: the idle scheduling class,
        which runs only on a core nothing else wants. A nice value alone is not enough: a trainer's
        OpenMP threads leave a core for moments between parallel regions, a niced process takes it, and
        each region then waits on it (a pre-start's imports, niced, added ~1.1 s to a 3.9 s update on 2
        cores; idle, 0-0.5 s). Only this worker (root) can restore it (renice), user code cannot."""
        return _child_setup(
            staged=self.staged,
            uid=self.uid,
            procs=self.cgroup.procs_files(),
            cpu_seconds=cpu_seconds,
            file_mb=file_mb,
            address_space_mb=self.limits.memory_mb,
            nice=nice,
        )

    def renice(self, nice: int = 0) -> None:
        """Every thread of the batch to the normal scheduling class at CPU priority `nice`."""
        self.cgroup.renice(nice)

    def close(self) -> None:
        """Kill what is left, remove the cgroup (both wait until no process of the batch is left), and give
        the uid back."""
        try:
            self.cgroup.remove()
        finally:
            self._lease.release()


def guest_python_args() -> list[str]:
    """The guest's command line inside the jail (after the interpreter). The guest reads its batch file
    only once told to start (see the sandbox's hand-over)."""
    return ["-I", "-u", "-X", "utf8", f"{GUEST_ROOT}/guest/_artweb_guest.py", f"{BATCH_DIR}/batch.json"]


if __name__ == "__main__":  # `python -m rollouts.runtime.jail`: say whether a jail can be built here
    try:
        conf = JailConfig(
            uids=uid_range(
                os.environ.get("ARTWEB_SANDBOX_UIDS") or os.environ.get("ARTWEB_SANDBOX_UID") or "64000-64999"
            ),
            cgroup_parent=os.environ.get("ARTWEB_SANDBOX_CGROUP", ""),
            uid_locks=os.environ.get("ARTWEB_SANDBOX_UID_LOCKS") or DEFAULT_LOCK_DIR,
        )
        jail_check(conf, sys.executable)
    except JailUnavailable as exc:
        print(f"no: {exc}")
        sys.exit(1)
    print(
        f"yes: bubblewrap at {bwrap_path()}, sandbox uids {conf.uids.start}-{conf.uids.stop - 1}, "
        f"a seccomp filter of {len(seccomp.filter_program()) // 8} instructions, "
        f"cgroups {_cgroup_layout(conf.cgroup_parent)}"
    )
