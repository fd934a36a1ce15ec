"""The jail's seccomp filter: the system calls and socket families user code never needs, refused before
the kernel code behind them runs.

Namespaces, capabilities and cgroups decide what user code may touch; every system call still reaches
the kernel, and a bug in a rarely used one (io_uring, BPF, a socket family, a line discipline) is an
escape from all of them. So bubblewrap installs this filter (`--seccomp FD`) right before it starts
the jailed program, and every process of the batch inherits it (`Seccomp: 2` in /proc/<pid>/status).

It refuses a list of calls and allows the rest (Docker's default profile does the converse, allowing a
list), with three safeguards: the list holds everything that profile refuses, and more; any call
numbered past the last one reviewed for it is refused too, so a newer kernel opens nothing new by
itself; and a call through another ABI than the native one (32-bit `int 0x80`, x32), which has numbers
and a `socketcall` multiplexer of its own, kills the process.

Answers: EPERM, what the kernel says to an unprivileged caller, unless a caller's fallback needs
another (ENOSYS for clone3 and for calls newer than the list, so libc falls back as on an older kernel;
EAFNOSUPPORT for socket families, as from a kernel built without them, so glibc's getaddrinfo and
similar probes carry on). Built with libseccomp (through the `pyseccomp` binding), once per process.
"""

from __future__ import annotations

import errno
import os
import platform
from functools import cache

from rollouts.sandbox import JailUnavailable

# Whole system calls refused, group by group: (errno, names). Names the native architecture lacks
# (iopl on arm64, vm86 on x86_64) are skipped by libseccomp.
REFUSED_CALLS: tuple[tuple[int, tuple[str, ...]], ...] = (
    # Kernel subsystems with a long record of exploitable bugs, none of which a rollout uses: io_uring
    # (refused by Docker, ChromeOS and Android for that record; EPERM is also what the kernel answers when
    # an administrator disables it, which libraries probe for), eBPF, perf events, page faults handled in
    # user space (userfaultfd: the usual way to win a race in a kernel exploit), and the kernel keyring,
    # which also outlives a batch and is shared by everything that runs as its uid.
    (
        errno.EPERM,
        (
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "keyctl",
            "add_key",
            "request_key",
        ),
    ),
    # The jail's mounts and namespaces are bubblewrap's, complete before this filter is installed: nothing
    # inside may change them, with the old mount call or the new mount API. (clone's namespace flags are
    # filtered below; clone3 further down.)
    (
        errno.EPERM,
        (
            "mount",
            "umount2",
            "pivot_root",
            "chroot",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "move_mount",
            "open_tree",
            "mount_setattr",
            "unshare",
            "setns",
        ),
    ),
    # Other processes' memory, files and state. ptrace too, unlike Docker on recent kernels: a sandbox
    # process sees only its own pid namespace (the guest and the script's children, all its own code, so
    # tracing them gains nothing the script does not already have), no rollout needs a debugger, and
    # ptrace has been the way into kernel bugs (PTRACE_TRACEME, CVE-2019-13272; seccomp bypasses before 4.8).
    (
        errno.EPERM,
        ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise"),
    ),
    # Administration of the machine, each behind a capability the jail does not have; refused so that
    # the capability check is not the only barrier (Docker's default profile refuses them all): kernel
    # code and reboots, swap, accounting, the kernel log, quotas, the clock, port I/O and the LDT (x86:
    # real-mode and DOS emulation only, and the LDT's code had exploitable bugs), a file by its handle
    # (open_by_handle_at walked out of Docker containers in 2014), whole-filesystem notifications,
    # terminal hang-up, and NUMA placement (the batch's memory is its cgroup's; libnuma reads a refused
    # get_mempolicy as "no NUMA here").
    (
        errno.EPERM,
        (
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
            "reboot",
            "swapon",
            "swapoff",
            "acct",
            "syslog",
            "quotactl",
            "quotactl_fd",
            "settimeofday",
            "clock_settime",
            "adjtimex",
            "clock_adjtime",
            "iopl",
            "ioperm",
            "modify_ldt",
            "open_by_handle_at",
            "name_to_handle_at",
            "fanotify_init",
            "vhangup",
            "get_mempolicy",
            "set_mempolicy",
            "set_mempolicy_home_node",
            "mbind",
            "migrate_pages",
            "move_pages",
        ),
    ),
    # Obsolete interfaces, kept by kernels for binaries of the 1990s (Docker refuses them too).
    (
        errno.EPERM,
        ("uselib", "ustat", "sysfs", "_sysctl", "nfsservctl", "lookup_dcookie", "vm86", "vm86old"),
    ),
    # clone3 passes its flags in memory, where a seccomp filter cannot read them, so it is refused whole
    # and clone's flags are checked instead. ENOSYS, not EPERM: glibc (2.34 and later) tries clone3 first
    # for every thread and child process, and falls back to clone only when it answers ENOSYS.
    (errno.ENOSYS, ("clone3",)),
)

# Calls newer than libseccomp 2.5 (which knows them up to 450), by number: from 424 on, a new call has
# the same number on every architecture a worker runs on. Reviewed up to Linux 6.18's last call, 469: the
# others of 451-469 are ordinary (cachestat, fchmodat2, futex2, mseal, the *xattrat calls...).
REFUSED_BY_NUMBER: tuple[tuple[int, int, str], ...] = (
    # The mount API's later call, refused with its siblings above.
    (errno.EPERM, 467, "open_tree_attr"),
    # The mount table by system call: new kernel code that shows nothing /proc/self/mountinfo does not.
    # ENOSYS, so that libmount falls back to that file as on an older kernel.
    (errno.ENOSYS, 457, "statmount"),
    (errno.ENOSYS, 458, "listmount"),
)

# Calls numbered past the last one reviewed, up to this bound, are refused with ENOSYS, what a kernel
# without them answers, so libc uses its fallback: a newer kernel opens nothing new by itself. The kernel
# answers ENOSYS past its own last call, so the bound only has to stay ahead of the kernels workers run.
REVIEWED_UP_TO = 469
UNREVIEWED_UP_TO = 599

# Socket families user code may create: local sockets (the inference proxy's) and IP, which inside the
# jail's network namespace reaches only its own loopback. Every other family is refused, each being
# kernel code of its own that namespaces do not confine alike: AF_VSOCK reaches the hypervisor and its
# host agents from a VM whatever the network namespace, AF_NETLINK talks to the kernel's own subsystems,
# AF_PACKET, AF_ALG, AF_KEY, AF_BLUETOOTH, AF_CAN, AF_TIPC, AF_RDS and others had exploitable bugs. glibc's
# getaddrinfo opens a netlink socket only to see which address families are configured, and assumes
# both when it cannot.
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
SOCKET_FAMILIES = (AF_UNIX, AF_INET, AF_INET6)

# clone's namespace flags (CLONE_NEWTIME is an unshare/clone3 flag; unshare and clone3 are refused).
CLONE_NEW_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

# Terminal ioctls: TIOCSTI pushes characters into a terminal's input (a command typed into the shell that
# owns it), TIOCLINUX reads and writes the console, TIOCSETD attaches a line discipline (n_gsm, n_hdlc:
# exploited kernel bugs) to a pseudo-terminal the jail can open. The command is an unsigned int: the
# upper half of the register is ignored by the kernel, so the comparison is masked to the lower half.
TIOCSTI, TIOCLINUX, TIOCSETD = 0x5412, 0x541C, 0x5423
REFUSED_IOCTLS = (TIOCSTI, TIOCLINUX, TIOCSETD)


INSTALL_HINT = (
    "The rollout sandbox needs libseccomp to build its system-call filter and fails closed without it: "
    "install the libseccomp2 package (Debian/Ubuntu: apt-get install libseccomp2, or `make sandbox-deps`; "
    "Fedora: dnf install libseccomp) and the pyseccomp Python package (pip install pyseccomp, one of "
    "artweb's dependencies)."
)


@cache
def filter_program() -> bytes:
    """The filter as a classic BPF program for bubblewrap's --seccomp; built once per process (a few ms).

    Raises JailUnavailable, naming what to install, when libseccomp or its binding is missing."""
    try:
        import pyseccomp as sc
    except (ImportError, RuntimeError) as exc:  # RuntimeError: the binding is there, libseccomp is not
        raise JailUnavailable(f"{INSTALL_HINT} ({exc})") from exc
    try:
        return _build(sc)
    except OSError as exc:
        raise JailUnavailable(
            f"libseccomp could not build the sandbox's system-call filter on this {platform.machine()} machine "
            f"({exc}); install libseccomp 2.5 or later. {INSTALL_HINT}"
        ) from exc


def _build(sc) -> bytes:
    f = sc.SyscallFilter(sc.ALLOW)
    # A call through another ABI than the native one: killed, not answered (see the module's docstring).
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    try:  # a binary search over the calls rather than a chain of comparisons (libseccomp 2.5 and later)
        f.set_attr(sc.Attr.CTL_OPTIMIZE, 2)
    except OSError:
        pass

    def refuse(err: int, name: str | int, *args) -> None:
        number = name if isinstance(name, int) else sc.resolve_syscall(sc.Arch.NATIVE, name)
        if number == -1:  # not a name this libseccomp knows: too old to be trusted with the list
            raise OSError(errno.ENOSYS, f"libseccomp does not know the system call {name!r}")
        f.add_rule(sc.ERRNO(err), number, *args)

    for err, names in REFUSED_CALLS:
        for name in names:
            refuse(err, name)
    for err, number, _ in REFUSED_BY_NUMBER:
        refuse(err, number)
    for number in range(REVIEWED_UP_TO + 1, UNREVIEWED_UP_TO + 1):
        refuse(errno.ENOSYS, number)

    # socket(family, ...): libseccomp compares an argument once per rule, so the families outside
    # SOCKET_FAMILIES are spelled out as ranges (a family with any of the upper 32 bits set is above them).
    low, high = min(SOCKET_FAMILIES), max(SOCKET_FAMILIES)
    refuse(errno.EAFNOSUPPORT, "socket", sc.Arg(0, sc.LT, low))
    refuse(errno.EAFNOSUPPORT, "socket", sc.Arg(0, sc.GT, high))
    for family in range(low + 1, high):
        if family not in SOCKET_FAMILIES:
            refuse(errno.EAFNOSUPPORT, "socket", sc.Arg(0, sc.EQ, family))
    refuse(errno.EAFNOSUPPORT, "socketpair", sc.Arg(0, sc.NE, AF_UNIX))

    for flag in CLONE_NEW_FLAGS.values():
        refuse(errno.EPERM, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))

    for request in REFUSED_IOCTLS:
        refuse(errno.EPERM, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))

    # personality: only PER_LINUX (0, what every process has) and the query (0xffffffff). Other values set
    # flags that weaken the process's memory protections (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE,
    # MMAP_PAGE_ZERO) or select compatibility modes (PER_LINUX32, UNAME26: Docker allows them) that nothing
    # here needs. An x neither 0 nor 0xffffffff (the kernel reads 32 bits) has, going round its bits, a set
    # bit followed by a clear one; each such pair is one masked comparison.
    for bit in range(32):
        following = (bit + 1) % 32
        refuse(errno.EPERM, "personality", sc.Arg(0, sc.MASKED_EQ, (1 << bit) | (1 << following), 1 << bit))

    with open(os.memfd_create("artweb-seccomp", os.MFD_CLOEXEC), "w+b") as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


def filter_fd() -> int:
    """A new descriptor holding the filter, for one bubblewrap to read (it reads from the offset to the
    end, so each process gets its own). Close-on-exec: pass it to bubblewrap with pass_fds."""
    fd = os.memfd_create("artweb-seccomp", os.MFD_CLOEXEC)
    try:
        program = filter_program()
        view = memoryview(program)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
