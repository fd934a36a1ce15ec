"""The jail's seccomp filter, from inside a real jail (bubblewrap, cgroups, the proxy), as a hostile
script meets it.

Each probe calls the system call itself through ctypes with the x86_64 number and arguments that would
do nothing harmful if it went through, and reports the errno it got; the test compares it with the
filter's answer. Where the call went through (the code before the filter), the probe closes what it got.
No probe connects a socket: creating one of a refused family must fail, which is the whole check, and
nothing here reaches an address outside 127.0.0.0/8.
"""

from __future__ import annotations

import platform
import socket
import sys

import pytest

from rollouts.sandbox.rollouts import run_rollouts
from tests.rollouts.sandbox.fake_judge import FakeJudge
from tests.rollouts.sandbox.test_hostile import report

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64", reason="the probes call system calls by their x86_64 numbers"
)

# Code for a probe: call(number, *args) -> the errno name, or "ok" when the call succeeded.
CALL = """
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(number, *args):
    args = [ctypes.c_char_p(a) if isinstance(a, bytes) else ctypes.c_long(a) for a in args]
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(number), *args)
    if result >= 0:
        return 'ok'
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
"""

AT_FDCWD = -100

# name: (x86_64 number, arguments, the filter's answer). Arguments: NULL pointers, bad descriptors or
# no-op values, so that a call the filter let through would fail or do nothing.
REFUSED = {
    "io_uring_setup": (425, (1, 0), "EPERM"),
    "io_uring_enter": (426, (-1, 0, 0, 0, 0, 0), "EPERM"),
    "io_uring_register": (427, (-1, 0, 0, 0), "EPERM"),
    "bpf": (321, (0, 0, 0), "EPERM"),
    "perf_event_open": (298, (0, 0, -1, -1, 0), "EPERM"),
    "userfaultfd": (323, (0,), "EPERM"),
    "keyctl": (250, (0, -3, 0), "EPERM"),  # KEYCTL_GET_KEYRING_ID of the session keyring
    "add_key": (248, (b"user", b"artweb-probe", 0, 0, -3), "EPERM"),
    "request_key": (249, (b"user", b"artweb-probe", 0, 0), "EPERM"),
    "mount": (165, (0, 0, 0, 0, 0), "EPERM"),
    "umount2": (166, (b"/", 0), "EPERM"),
    "pivot_root": (155, (b"/", b"/"), "EPERM"),
    "chroot": (161, (b"/",), "EPERM"),
    "fsopen": (430, (b"tmpfs", 0), "EPERM"),
    "fsconfig": (431, (-1, 0, 0, 0, 0), "EPERM"),
    "fsmount": (432, (-1, 0, 0), "EPERM"),
    "fspick": (433, (AT_FDCWD, b"/", 0), "EPERM"),
    "move_mount": (429, (-1, b"", -1, b"", 0), "EPERM"),
    "open_tree": (428, (AT_FDCWD, b"/", 0), "EPERM"),
    "mount_setattr": (442, (-1, b"", 0, 0, 0), "EPERM"),
    "unshare": (272, (0,), "EPERM"),
    "setns": (308, (-1, 0), "EPERM"),
    "ptrace": (101, (2, 1, 0, 0), "EPERM"),  # PTRACE_PEEKDATA of the jail's init
    "process_vm_readv": (310, ("PID", 0, 0, 0, 0, 0), "EPERM"),
    "process_vm_writev": (311, ("PID", 0, 0, 0, 0, 0), "EPERM"),
    "kcmp": (312, ("PID", "PID", 0, 0, 0), "EPERM"),
    "pidfd_getfd": (438, (-1, 0, 0), "EPERM"),
    "process_madvise": (440, (-1, 0, 0, 0, 0), "EPERM"),
    "kexec_load": (246, (0, 0, 0, 0), "EPERM"),
    "kexec_file_load": (320, (-1, -1, 0, 0, 0), "EPERM"),
    "init_module": (175, (0, 0, b""), "EPERM"),
    "finit_module": (313, (-1, b"", 0), "EPERM"),
    "delete_module": (176, (b"artweb_probe", 0), "EPERM"),
    "reboot": (169, (0, 0, 0, 0), "EPERM"),
    "swapon": (167, (0, 0), "EPERM"),
    "swapoff": (168, (0,), "EPERM"),
    "acct": (163, (0,), "EPERM"),
    "syslog": (103, (10, 0, 0), "EPERM"),  # SYSLOG_ACTION_SIZE_BUFFER
    "quotactl": (179, (0, 0, 0, 0), "EPERM"),
    "quotactl_fd": (443, (-1, 0, 0, 0), "EPERM"),
    "settimeofday": (164, (0, 0), "EPERM"),
    "clock_settime": (227, (0, 0), "EPERM"),
    "adjtimex": (159, (0,), "EPERM"),
    "clock_adjtime": (305, (0, 0), "EPERM"),
    "iopl": (172, (0,), "EPERM"),
    "ioperm": (173, (0, 0, 0), "EPERM"),
    "modify_ldt": (154, (0, 0, 0), "EPERM"),
    "open_by_handle_at": (304, (-1, 0, 0), "EPERM"),
    "name_to_handle_at": (303, (AT_FDCWD, b"/", 0, 0, 0), "EPERM"),
    "fanotify_init": (300, (0, 0), "EPERM"),
    "vhangup": (153, (), "EPERM"),
    "get_mempolicy": (239, (0, 0, 0, 0, 0), "EPERM"),
    "set_mempolicy": (238, (0, 0, 0), "EPERM"),  # MPOL_DEFAULT: what the process has
    "set_mempolicy_home_node": (450, (0, 0, 0, 0), "EPERM"),
    "mbind": (237, (0, 0, 0, 0, 0, 0), "EPERM"),
    "migrate_pages": (256, (0, 0, 0, 0), "EPERM"),
    "move_pages": (279, (0, 0, 0, 0, 0, 0), "EPERM"),
    "uselib": (134, (0,), "EPERM"),
    "ustat": (136, (0, 0), "EPERM"),
    "sysfs": (139, (3, 0, 0), "EPERM"),
    "_sysctl": (156, (0,), "EPERM"),
    "nfsservctl": (180, (0, 0, 0), "EPERM"),
    "lookup_dcookie": (212, (0, 0, 0), "EPERM"),
    # glibc falls back to clone when clone3 says ENOSYS.
    "clone3": (435, (0, 0), "ENOSYS"),
    # Newer calls, by number: refused ones of those reviewed, and any past the last one reviewed.
    "open_tree_attr": (467, (AT_FDCWD, b"/", 0, 0, 0), "EPERM"),
    "statmount": (457, (0, 0, 0, 0), "ENOSYS"),
    "listmount": (458, (0, 0, 0, 0), "ENOSYS"),
    "unreviewed_470": (470, (0, 0, 0), "ENOSYS"),
    "unreviewed_599": (599, (0, 0, 0), "ENOSYS"),
}

# Every socket family but AF_UNIX, AF_INET and AF_INET6 (Linux knows families up to 45).
REFUSED_FAMILIES = [f for f in range(46) if f not in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6)]


def run_probe(request_for, code: str, **kwargs) -> dict:
    """Run `code` (which fills `out`) in the jail as scenario 0's rollout; scenario 1 must stay well."""
    results = run_rollouts(request_for(report(CALL + code), group_size=1, **kwargs))
    good = results[1].trajectories[0]
    assert good["reward"] == 1.0 and good["error"] is None, good["error"]
    probe = results[0].trajectories[0]
    assert probe["error"] is None, probe["error"]
    return probe["metadata"]


def test_it_filters_every_process_of_the_jail(request_for):
    out = run_probe(
        request_for,
        "import subprocess\n"
        "out['guest'] = [l.split(':')[1].strip() for l in open('/proc/self/status') if l.startswith('Seccomp:')]\n"
        "out['child'] = subprocess.run(['/bin/grep', '^Seccomp:', '/proc/self/status'], capture_output=True, "
        "text=True).stdout.split()\n",
    )
    assert out == {"guest": ["2"], "child": ["Seccomp:", "2"]}  # 2: a filter is installed


def test_it_refuses_each_listed_system_call(request_for):
    calls = {name: (number, args) for name, (number, args, _) in REFUSED.items()}
    code = (
        f"for name, (number, args) in {calls!r}.items():\n"
        "    out[name] = call(number, *[os.getpid() if a == 'PID' else a for a in args])\n"
    )
    out = run_probe(request_for, code)
    assert out == {name: expected for name, (_, _, expected) in REFUSED.items()}


def test_it_refuses_every_socket_family_but_unix_and_ip(request_for):
    code = (
        f"for family in {REFUSED_FAMILIES!r}:\n"
        "    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW, socket.SOCK_SEQPACKET):\n"
        "        try:\n"
        "            socket.socket(family, kind).close()\n"  # never connected: creating it is the check
        "            out[f'{family}/{kind}'] = 'created'\n"
        "        except OSError as e:\n"
        "            out[f'{family}/{kind}'] = errno.errorcode[e.errno]\n"
        # AF_VSOCK (40) with a bit of the register's upper half set, which the kernel ignores.
        "out['vsock_high_bits'] = call(41, (1 << 32) | 40, socket.SOCK_STREAM, 0)\n"
        "out['socketpair_inet'] = call(53, socket.AF_INET, socket.SOCK_STREAM, 0, 0)\n"
        "allowed = {}\n"
        "for family, kind in [(socket.AF_UNIX, socket.SOCK_STREAM), (socket.AF_UNIX, socket.SOCK_DGRAM),\n"
        "                     (socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET, socket.SOCK_DGRAM),\n"
        "                     (socket.AF_INET6, socket.SOCK_STREAM)]:\n"
        "    socket.socket(family, kind).close()\n"
        "    allowed[f'{family}/{kind}'] = 'created'\n"
        "a, b = socket.socketpair()\n"
        "a.sendall(b'x'); allowed['socketpair'] = b.recv(1).decode()\n"
        "allowed['getaddrinfo'] = sorted({ai[4][0] for ai in socket.getaddrinfo('localhost', 80)})\n"
        "out['allowed'] = allowed\n"
    )
    out = run_probe(request_for, code)
    assert out.pop("allowed") == {
        "1/1": "created",
        "1/2": "created",
        "2/1": "created",
        "2/2": "created",
        "10/1": "created",
        "socketpair": "x",
        "getaddrinfo": ["127.0.0.1"],  # /etc/hosts: the first entry (no host.conf asks for more)
    }
    assert out.pop("vsock_high_bits") == out.pop("socketpair_inet") == "EAFNOSUPPORT"
    assert out["40/1"] == "EAFNOSUPPORT"  # AF_VSOCK: the hypervisor's side of a VM
    assert set(out.values()) == {"EAFNOSUPPORT"}, {k: v for k, v in out.items() if v != "EAFNOSUPPORT"}


def test_it_refuses_new_namespaces_but_runs_threads_forks_and_subprocesses(request_for):
    flags = {
        "NEWNS": 0x00020000,
        "NEWCGROUP": 0x02000000,
        "NEWUTS": 0x04000000,
        "NEWIPC": 0x08000000,
        "NEWUSER": 0x10000000,
        "NEWPID": 0x20000000,
        "NEWNET": 0x40000000,
    }
    code = (
        "import signal, subprocess, threading\n"
        f"for name, flag in {flags!r}.items():\n"
        # Were it let through, the child (a copy, as after fork) leaves at once.
        "    ctypes.set_errno(0)\n"
        "    pid = libc.syscall(ctypes.c_long(56), ctypes.c_long(flag | signal.SIGCHLD), 0, 0, 0, 0)\n"
        "    if pid == 0:\n"
        "        os._exit(0)\n"
        "    if pid > 0:\n"
        "        os.waitpid(pid, 0)\n"
        "        out[name] = 'ok'\n"
        "    else:\n"
        "        out[name] = errno.errorcode[ctypes.get_errno()]\n"
        "t = threading.Thread(target=lambda: out.__setitem__('thread', 'ran'))\n"
        "t.start(); t.join()\n"
        "out['subprocess'] = subprocess.run(['/bin/echo', 'ran'], capture_output=True, text=True).stdout.strip()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(7)\n"
        "out['fork'] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])\n"
    )
    out = run_probe(request_for, code)
    assert out == {**dict.fromkeys(flags, "EPERM"), "thread": "ran", "subprocess": "ran", "fork": 7}


def test_it_refuses_terminal_injection_and_line_disciplines(request_for):
    code = (
        "import fcntl, termios\n"
        "master = os.open('/dev/ptmx', os.O_RDWR | os.O_NOCTTY)\n"
        "c = ctypes.c_char(b'x')\n"
        "for name, request in [('TIOCSTI', 0x5412), ('TIOCLINUX', 0x541C), ('TIOCSETD', 0x5423)]:\n"
        "    out[name] = call(16, master, request, ctypes.addressof(c))\n"
        # The kernel reads the request as 32 bits: the upper half of the register must not slip past.
        "    out[name + '_high_bits'] = call(16, master, (1 << 32) | request, ctypes.addressof(c))\n"
        "out['TCGETS'] = len(termios.tcgetattr(master))\n"  # other terminal ioctls work
    )
    out = run_probe(request_for, code)
    assert out.pop("TCGETS") == 7
    assert out == dict.fromkeys(out, "EPERM") and len(out) == 6


def test_it_allows_personality_only_to_query_or_keep_the_default(request_for):
    values = [0, 0xFFFFFFFF, 0x0008, 0x20000, 0x0040000, 0x0400000, 0x0100000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE]
    code = f"for value in {values!r}:\n    out[hex(value)] = call(135, value)\n"
    out = run_probe(request_for, code)
    assert out == {
        "0x0": "ok",
        "0xffffffff": "ok",
        **{hex(v): "EPERM" for v in values[2:]},
    }


def test_it_kills_a_process_that_calls_the_kernel_through_another_abi(request_for):
    """32-bit calls (int 0x80) and x32 calls have numbers and a socketcall multiplexer of their own, which
    the filter does not read: they kill the process. Each is tried in a forked child."""
    code = (
        "import mmap, signal\n"
        "def child(attempt):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        attempt()\n"
        "        os._exit(0)\n"
        "    status = os.waitpid(pid, 0)[1]\n"
        "    return signal.Signals(os.WTERMSIG(status)).name if os.WIFSIGNALED(status) else 'returned'\n"
        "def x32_getpid():\n"
        "    libc.syscall(ctypes.c_long(0x40000000 | 39))\n"
        "def int80_getpid():\n"
        "    page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "    page.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))  # mov eax, 20 (getpid); int 0x80; ret\n"
        "    ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()\n"
        "out['x32'] = child(x32_getpid)\n"
        "out['int80'] = child(int80_getpid)\n"
    )
    out = run_probe(request_for, code)
    assert out["x32"] == "SIGSYS"
    # SIGSEGV only on a kernel without 32-bit emulation, which refuses the call before seccomp sees it.
    assert out["int80"] in ("SIGSYS", "SIGSEGV")


def test_the_openai_client_still_reaches_the_model_through_the_proxy(request_for):
    code = (
        "client = model.openai_client()\n"
        "answer = await client.chat.completions.create(model=model.get_inference_name(), "
        "messages=[{'role': 'user', 'content': 'hi'}])\n"
        "out['answer'] = answer.choices[0].message.content\n"
    )
    with FakeJudge([], reply="hello from the model") as upstream:
        out = run_probe(request_for, code, base_url=upstream.base_url, model_name="policy")
    assert out == {"answer": "hello from the model"}
    assert [r["body"]["model"] for r in upstream.requests] == ["policy"]


def test_it_fails_closed_naming_what_to_install_without_libseccomp(request_for, monkeypatch):
    """libseccomp's absence is simulated (an import of its binding that fails): it is installed here."""
    from rollouts.sandbox import jail, process, seccomp

    started = []
    monkeypatch.setattr(process.Sandbox, "start", lambda *a, **k: started.append(a))
    monkeypatch.setitem(sys.modules, "pyseccomp", None)
    seccomp.filter_program.cache_clear()
    jail.jail_check.cache_clear()
    try:
        with pytest.raises(jail.JailUnavailable, match=r"libseccomp2.*pyseccomp"):
            run_rollouts(request_for(report("")))
    finally:
        seccomp.filter_program.cache_clear()
        jail.jail_check.cache_clear()
    assert started == []  # no user code ran


def test_every_call_the_filter_refuses_is_probed_here():
    """A call added to the filter's list without a probe above fails here; so does a probe of a call the
    list lost."""
    import pyseccomp

    from rollouts.sandbox import seccomp

    listed = {
        name
        for _, names in seccomp.REFUSED_CALLS
        for name in names
        if pyseccomp.resolve_syscall(pyseccomp.Arch.X86_64, name) >= 0  # vm86 and vm86old are 32-bit only
    }
    listed |= {name for _, _, name in seccomp.REFUSED_BY_NUMBER}
    unreviewed = {name for name, (number, _, _) in REFUSED.items() if number > seccomp.REVIEWED_UP_TO}
    assert set(REFUSED) - unreviewed == listed
    assert unreviewed and all(REFUSED[name][2] == "ENOSYS" for name in unreviewed)
    assert max(number for number, _, _ in REFUSED.values()) == seccomp.UNREVIEWED_UP_TO
    program = seccomp.filter_program()
    assert len(program) % 8 == 0 and len(program) // 8 < 4096  # the kernel takes up to 4096 instructions
