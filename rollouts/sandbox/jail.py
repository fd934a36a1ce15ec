"""The jail around user code: bubblewrap for the namespaces and the filesystem view, cgroups for the
batch's memory, process and CPU budget.

Why bubblewrap: it is the small, audited tool Flatpak builds its sandboxes on, packaged by every
distribution, starts a jail in ~10 ms, and needs no daemon or setuid bit when the caller may create
user namespaces. It does namespaces and mounts only, so the batch-wide limits are cgroups set up by the
worker (nsjail does both, but no Debian release packages it). The cgroups are rollouts.sandbox.cgroups;
what the jail sees, and how it is staged, rollouts.sandbox.mounts.

Each sandbox process of a batch runs as

    worker (root) ─ fork ─ join the batch's cgroups, rlimits, drop to the batch's uid, no_new_privs
                   └ exec bwrap: new user, pid, mount, ipc, uts, cgroup and network namespaces,
                                 no capabilities, no nested user namespaces, a new session,
                                 the seccomp filter (rollouts.sandbox.seccomp)
                     └ python guest: sees /usr, the interpreter, the SDK, its batch's files (read-only),
                                     a private size-limited /tmp and /dev/shm, a /proc of its own
                                     pid namespace, and one unix socket: the inference proxy.

The batch's uid is neither root nor the worker's, so the host's permission checks stop anything that
leaks through a mount, and no other live batch of the host has it (rollouts.sandbox.uid_lease), so no
quota, keyring or signal is shared between batches. The network namespace holds only a loopback
interface: no PostgreSQL, Redis, vLLM or anything else. When the batch ends, killing bwrap kills the
namespace's init and with it every process of the namespace, whatever it forked or re-parented; the
cgroup is then swept and removed, and the uid given back.

What the jail's /proc/self/mountinfo shows of the host: /usr and the base interpreter's directory
(bound where they are: a virtualenv's pyvenv.cfg and symlinks name it) and the batch's work directory
(a random name under the worker's TMPDIR), and each of the run's data attachments (its stored file, bound
on its own: rollouts.sandbox.attachments). Everything bound at a path of the jail's own (the
virtualenv, the SDK) is mounted through a read-only overlay of a staging name, so neither its host path
nor its filesystem's layout shows; the data dir and the project checkout are never mounted.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from rollouts.sandbox import JailUnavailable, seccomp
from rollouts.sandbox.cgroups import Cgroup, cgroup_layout
from rollouts.sandbox.mounts import (
    BATCH_DIR,
    FALLBACKS_DIR,
    GUEST_DIR,
    GUEST_ROOT,
    INSIDE_UID,
    SCRATCH,
    SOCKET_DIR,
    child_setup,
    etc_files,
    interpreter,
    jail_sources,
    stage,
    stage_files,
    system_mounts,
)
from rollouts.sandbox.uid_lease import DEFAULT_LOCK_DIR, DEFAULT_UIDS, uid_lease, uid_range

OPT_OUT = "insecure-no-jail"  # ARTWEB_SANDBOX's value for the development opt-out


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
        *system_mounts(),
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
    cgroup_layout(config.cgroup_parent)
    lease = uid_lease(config.uids, config.uid_locks)
    filter_fd = seccomp.filter_fd()
    try:
        with tempfile.TemporaryDirectory(prefix="artweb-jail-probe-") as tmp:
            Path(tmp).chmod(0o711)
            staged = stage(Path(tmp) / "stage", jail_sources(python, GUEST_DIR, FALLBACKS_DIR))
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
                preexec_fn=child_setup(staged=staged, uid=lease.uid, procs=[], cpu_seconds=120, file_mb=64),
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
        files: dict[str, str] | None = None,
    ) -> None:
        """root: the batch's directory (mode 0711); each sandbox's files are in root/shared/<name>. files:
        host file -> its path in the jail, each bound on its own, read-only (a run's data attachments).

        Raises JailUnavailable when the jail cannot be built here or no sandbox uid is free."""
        jail_check(config, python)
        self.limits = limits
        self.root = root
        self.socket_dir = socket_dir
        self.python = interpreter(python).python  # the interpreter's path inside the jail
        self.staged = stage(root / "stage", jail_sources(python, guest_dir, fallbacks_dir))
        self.files = stage_files(root / "stage-files", files or {})
        self.etc = etc_files(root / "shared")
        self._lease = uid_lease(config.uids, config.uid_locks)
        self.uid = self._lease.uid  # the batch's own, outside its user namespace
        try:
            self.cgroup = Cgroup.create(f"batch-{uuid.uuid4().hex[:12]}", limits, config.cgroup_parent)
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
            *[arg for _, staging, inside in self.files for arg in ("--ro-bind", staging, inside)],
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
        return child_setup(
            staged=self.staged,
            uid=self.uid,
            procs=self.cgroup.procs_files(),
            cpu_seconds=cpu_seconds,
            file_mb=file_mb,
            address_space_mb=self.limits.memory_mb,
            nice=nice,
            files=self.files,
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


if __name__ == "__main__":  # `python -m rollouts.sandbox.jail`: say whether a jail can be built here
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
        f"cgroups {cgroup_layout(conf.cgroup_parent)}"
    )
