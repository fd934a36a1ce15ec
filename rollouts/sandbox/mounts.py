"""What the jail sees, and how the child process stages it between fork and exec.

The jail's view: /usr, the interpreter, the SDK and the guest program under GUEST_ROOT, its batch's files
(read-only), a private /tmp and /dev/shm, and its own /etc (passwd, group, hosts). How each host directory
gets there without showing its host path is in stage() (see rollouts.sandbox.jail for the whole picture).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from rollouts.sandbox import JailUnavailable

# On the host: the guest program and the SDK (bound at GUEST_ROOT/guest), and the stand-ins for optional
# libraries that lose to a real install (GUEST_ROOT/guest_fallbacks).
GUEST_DIR = Path(__file__).resolve().parent / "guest"
FALLBACKS_DIR = Path(__file__).resolve().parent / "guest_fallbacks"

# Paths inside the jail.
GUEST_ROOT = "/opt/artweb"  # the SDK and the guest program
VENV_INSIDE = f"{GUEST_ROOT}/python"  # the sandbox interpreter's virtualenv, if it is one
BATCH_DIR = "/batch"  # the batch's own files, read-only
SOCKET_DIR = "/run/artweb"  # the inference proxy's socket
SCRATCH = "/tmp"  # the only writable place (and /dev/shm)
INSIDE_UID = 1000  # the uid user code sees; outside it is the batch's leased uid


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


def system_mounts() -> list[str]:
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


_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: nothing may be loaded between fork and exec
_CLONE_NEWNS = 0x00020000
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x1, 0x20, 0x1000, 0x4000, 0x40000


def jail_sources(python: str, guest_dir: Path, fallbacks_dir: Path) -> dict[str, str]:
    """Host directory → where the jail sees it: the interpreter's (see interpreter()), the SDK under GUEST_ROOT."""
    found = dict(interpreter(python).binds)
    found[str(guest_dir)] = f"{GUEST_ROOT}/guest"
    found[str(fallbacks_dir)] = f"{GUEST_ROOT}/guest_fallbacks"
    return found


def stage(stage_dir: Path, sources: dict[str, str]) -> list[tuple[str, str, str]]:
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


def stage_files(stage_dir: Path, files: dict[str, str]) -> list[tuple[str, str, str]]:
    """(host file, staging file, jail path) for each file the jail sees on its own (a run's attachments).

    As for stage(): the child binds each host file, as root, on an empty staging file the sandbox uid can
    reach, and bwrap binds that read-only at its jail path. A file cannot be overlaid, so the jail's
    mountinfo names the host file's path inside its filesystem."""
    staged = []
    if files:
        stage_dir.mkdir(parents=True, exist_ok=True)
        stage_dir.chmod(0o755)
    for i, (host, inside) in enumerate(files.items()):
        f = stage_dir / f"file-{i}"
        f.touch(mode=0o444)
        staged.append((host, str(f), inside))
    return staged


def child_setup(
    *,
    staged: list[tuple[str, str, str]],
    uid: int,
    procs: list[str],
    cpu_seconds: int,
    file_mb: int,
    address_space_mb: int | None = None,
    nice: int = 0,
    files: list[tuple[str, str, str]] = (),
) -> Callable[[], None]:
    """What the child does between fork and exec, as root: join the batch's cgroups, set rlimits and the
    CPU priority (`nice` > 0: that nice value under the idle scheduling class, see Jail.preexec), stage
    the sources (see stage) and the files (see stage_files), then become the sandbox uid for good.

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
    file_mounts = [(host.encode(), staging.encode()) for host, staging, _ in files]

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
        for host, where in file_mounts:
            # Read-only already here, before bwrap's user namespace copies it: the flag is then locked there
            # (MNT_LOCK_READONLY), so not even a process with every capability of the jail could lift it.
            if _LIBC.mount(host, where, None, _MS_BIND, None) != 0:
                fail("staging a file")
            if _LIBC.mount(None, where, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY, None) != 0:
                fail("making a staged file read-only")
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)

    return apply
