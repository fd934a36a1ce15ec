"""Hostile user code against the real jail, proxy and result reader.

Every script here is what a stranger could upload. Each test runs it through run_rollouts exactly as a
run step does (bubblewrap, cgroups, the inference proxy) and checks two things: the attack got nothing,
and it ended as a recorded per-rollout or per-batch error while well-behaved rollouts carried on. Where
the attack needs a target (a listening PostgreSQL, a readable file), the test first shows the target is
there from outside the jail, so the check cannot pass for want of one.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Self

import pytest

from rollouts.sandbox.batch import SandboxLimits
from rollouts.sandbox.rollouts import run_rollouts
from tests.rollouts.sandbox.scripts import script


def report(code: str) -> str:
    """A script whose rollout runs `code` (which fills dict `out`) and returns it as metadata."""
    body = (
        "out = {}\n" + code + "\nreturn art.Trajectory(messages_and_choices=[{'role': 'user', 'content': 'x'}], "
        "reward=1.0, metadata=out)"
    )
    return script(body)


def named(comm: str) -> list[int]:
    """Live processes on this host whose name (comm) is `comm`: hostile children rename themselves so the
    test finds exactly them, whatever else runs on the machine."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2]
        if name == comm and state not in "ZX":  # a zombie is dead, only not yet reaped
            found.append(int(entry))
    return found


class Seen:
    """Watches, from outside, for processes named `comm` while a batch runs."""

    def __init__(self, comm: str) -> None:
        self.comm, self.pids, self._stop = comm, set(), threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            self.pids.update(named(self.comm))

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def rename(comm: str) -> str:
    """Code that sets the calling process's name."""
    return f"import ctypes\nctypes.CDLL(None).prctl(15, {comm.encode()!r}, 0, 0, 0)\n"


def good_group_ok(results) -> None:
    good = results[1]
    assert [t["reward"] for t in good.trajectories] == [1.0, 1.0], good.errors
    assert all(t["error"] is None for t in good.trajectories)


def test_it_runs_user_code_as_an_unprivileged_uid_without_capabilities(request_for):
    results = run_rollouts(
        request_for(
            report(
                "out['ids'] = [os.getuid(), os.geteuid(), os.getgid()]\n"
                "out['status'] = {l.split(':')[0]: l.split(':')[1].strip() for l in open('/proc/self/status') "
                "if l.startswith(('CapEff', 'CapPrm', 'CapBnd', 'NoNewPrivs'))}\n"
                "try:\n    out['shadow'] = open('/etc/shadow').read()\nexcept OSError as e:\n    out['shadow'] = type(e).__name__\n"
            )
        )
    )
    out = results[0].trajectories[0]["metadata"]
    assert out["ids"] == [1000, 1000, 1000]
    assert out["status"] == {
        "CapEff": "0000000000000000",
        "CapPrm": "0000000000000000",
        "CapBnd": "0000000000000000",
        "NoNewPrivs": "1",
    }
    assert out["shadow"] == "FileNotFoundError"
    assert Path("/etc/shadow").exists()  # the host has one; the jail does not show it


def test_it_hides_every_other_process_and_the_workers_environment(request_for, monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "hunter2-secret-key")
    monkeypatch.setenv("DATABASE_URL", "postgres://artweb:hunter2@127.0.0.1/artweb")
    results = run_rollouts(
        request_for(
            report(
                "out['pids'] = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
                "out['ppid'] = os.getppid()\n"
                "leaks = []\n"
                "for p in out['pids'] + [os.getppid()]:\n"
                "    try:\n"
                "        if b'hunter2' in open(f'/proc/{p}/environ', 'rb').read():\n"
                "            leaks.append(p)\n"
                "    except OSError:\n"
                "        pass\n"
                "out['leaks'] = leaks\n"
                "out['cmdlines'] = [open(f'/proc/{p}/cmdline', 'rb').read().decode(errors='replace') for p in out['pids']]\n"
            )
        )
    )
    out = results[0].trajectories[0]["metadata"]
    assert out["leaks"] == []
    # Only the jail's own init and the guest: not the worker, not pytest, not PostgreSQL.
    assert len(out["pids"]) <= 3, out["cmdlines"]
    assert not any("pytest" in c or "postgres" in c for c in out["cmdlines"])
    assert os.getppid() > 1  # the worker does have a parent outside: it is just not visible


def test_it_reaches_neither_postgresql_nor_redis_nor_anything_on_the_network(request_for):
    for port in (5432, 6379):  # they are there, for the worker
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    results = run_rollouts(
        request_for(
            report(
                "for host, port in [('127.0.0.1', 5432), ('127.0.0.1', 6379), ('localhost', 5432), ('10.0.0.1', 80),\n"
                "                   ('8.8.8.8', 53)]:\n"
                "    s = socket.socket()\n"
                "    s.settimeout(2)\n"
                "    try:\n"
                "        s.connect((host, port))\n"
                "        out[f'{host}:{port}'] = 'open'\n"
                "    except OSError as e:\n"
                "        out[f'{host}:{port}'] = type(e).__name__\n"
                # From /proc: socket.if_nameindex() asks netlink, a socket family the jail refuses.
                "out['ifaces'] = sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:])\n"
            )
        )
    )
    out = results[0].trajectories[0]["metadata"]
    assert out.pop("ifaces") == ["lo"]
    assert "open" not in out.values(), out
    assert out["127.0.0.1:5432"] == out["127.0.0.1:6379"] == "ConnectionRefusedError"


def test_it_shows_no_data_dir_project_or_other_batch(request_for, tmp_path):
    # Another run's upload and checkpoint, readable by anyone on the host: only the mount view protects them.
    other = tmp_path / "data" / "checkpoints" / "run-7" / "step-000001"
    other.mkdir(parents=True)
    (other / "adapter_model.safetensors").write_text("other user's weights")
    for d in (tmp_path, *tmp_path.rglob("*")):
        d.chmod(0o755 if d.is_dir() else 0o644)
    repo = Path(__file__).resolve().parents[3]
    targets = [
        str(other / "adapter_model.safetensors"),
        str(repo / "artweb" / "settings.py"),
        str(repo / "pyproject.toml"),
        "/etc/passwd",
    ]
    results = run_rollouts(
        request_for(
            report(
                f"for path in {targets!r}:\n"
                "    try:\n"
                "        out[path] = open(path).read()[:200]\n"
                "    except OSError as e:\n"
                "        out[path] = type(e).__name__\n"
                "out['batch'] = sorted(os.listdir('/batch'))\n"
            )
        )
    )
    out = results[0].trajectories[0]["metadata"]
    assert out.pop("batch") == ["batch.json", "rollout.py"]
    passwd = out.pop("/etc/passwd")
    assert "root:" not in passwd and "sandbox" in passwd
    assert set(out.values()) == {"FileNotFoundError"}, out


def test_its_mount_table_names_no_path_of_the_project_or_the_virtualenv(request_for):
    """/proc/self/mountinfo gives each mount's directory inside its filesystem and its options: none may
    name the project checkout (the default data dir is in it, so are the SDK's sources) or the virtualenv.
    Of the host it may show /usr, a few /etc files, the base interpreter's installation and the batch's
    own work directory, nothing else."""
    repo = Path(__file__).resolve().parents[3]
    hidden = [str(repo)]
    if sys.prefix != sys.base_prefix:  # a virtualenv: the jail has it under a name of its own
        hidden += [sys.prefix, os.path.realpath(sys.prefix)]
    shown = (
        "/usr/",
        "/etc/",
        os.path.realpath(sys.base_prefix) + "/",
        f"{os.path.realpath(tempfile.gettempdir())}/artweb-batch-",
    )
    results = run_rollouts(
        request_for(report("out['mountinfo'] = open('/proc/self/mountinfo').read()\nout['prefix'] = sys.prefix\n"))
    )
    out = results[0].trajectories[0]["metadata"]
    assert [path for path in hidden if path in out["mountinfo"]] == []
    host_dirs = []
    for line in out["mountinfo"].splitlines():
        fields, fstype = line.split(" - ")[0].split(), line.split(" - ")[1].split()[0]
        if fstype not in ("tmpfs", "proc", "devpts", "devtmpfs", "overlay"):
            host_dirs.append(fields[3])
    assert host_dirs and [d for d in host_dirs if not (d + "/").startswith(shown)] == []
    # The interpreter the jail runs is the same one, under the jail's name for it.
    assert out["prefix"] == ("/opt/artweb/python" if sys.prefix != sys.base_prefix else sys.prefix)
    good_group_ok(results)


def test_it_lets_user_code_write_only_to_its_private_scratch(request_for):
    marker = f"artweb-hostile-{uuid.uuid4().hex}"
    places = ["/", "/usr", "/batch", "/opt/artweb/guest", "/run/artweb", "/etc", "/proc/1", "/root"]
    results = run_rollouts(
        request_for(
            report(
                f"for d in {places!r}:\n"
                "    try:\n"
                f"        open(os.path.join(d, {marker!r}), 'w').write('x')\n"
                "        out[d] = 'written'\n"
                "    except OSError as e:\n"
                "        out[d] = type(e).__name__\n"
                f"open('/tmp/{marker}', 'w').write('scratch')\n"
                f"open('/dev/shm/{marker}', 'w').write('shm')\n"
                "out['tmp'] = os.listdir('/tmp')\n"
            )
        )
    )
    out = results[0].trajectories[0]["metadata"]
    assert marker in out.pop("tmp")
    assert "written" not in out.values(), out
    # The scratch was private and is gone: nothing on the host's /tmp or /dev/shm.
    assert not Path(f"/tmp/{marker}").exists() and not Path(f"/dev/shm/{marker}").exists()
    good_group_ok(results)


def test_it_kills_a_setsid_survivor_with_its_batch(request_for, tmp_path):
    comm = f"surv{uuid.uuid4().hex[:8]}"
    # libc's fork and setsid: the guest's audit hook, which refuses a fork from a forked child, never sees them.
    survivor = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None)\n"
        "pid = libc.fork()\n"
        "if pid == 0:\n"
        "    libc.setsid()\n"
        "    if libc.fork() == 0:\n"
        "        import time\n"
        f"        libc.prctl(15, {comm.encode()!r}, 0, 0, 0)\n"
        "        while True:\n"
        "            for target in ('/batch/rollout.py', '/tmp/x'):\n"
        "                try:\n"
        "                    open(target, 'w').write('reward = 999')\n"
        "                except OSError:\n"
        "                    pass\n"
        "            time.sleep(0.05)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "await asyncio.sleep(1)\n"
    )
    with Seen(comm) as seen:
        results = run_rollouts(request_for(script(survivor)))
    assert seen.pids, "the survivor never ran"  # it was alive while the batch was
    assert results[0].trajectories[0]["error"] is None
    assert named(comm) == []
    # The next batch is untouched by anything the last one left running.
    results = run_rollouts(request_for(script("pass")))
    assert [t["reward"] for g in results for t in g.trajectories] == [1.0] * 4


def test_it_bounds_a_ctypes_fork_past_the_audit_hook(request_for):
    comm = f"bomb{uuid.uuid4().hex[:8]}"
    bomb = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None)\n"
        f"libc.prctl(15, {comm.encode()!r}, 0, 0, 0)\n"
        "while True:\n"
        "    if libc.fork() < 0:\n"
        "        raise OSError('fork refused')\n"
    )
    started = time.monotonic()
    results = run_rollouts(
        request_for(
            script(bomb), sandboxes=2, limits=SandboxLimits(rollout_timeout_s=10, batch_timeout_s=30, max_processes=16)
        )
    )
    assert time.monotonic() - started < 60
    # The process budget is the batch's, so its other groups may starve too; other batches do not
    # (test_it_keeps_other_batches_running_while_one_attacks).
    assert all(t["error"] for t in results[0].trajectories)
    assert named(comm) == []


@pytest.mark.slow
def test_it_caps_memory_spread_over_forked_children(request_for):
    # Each child alone is within the limit; together they are not.
    spread = (
        "kids = []\n"
        "for _ in range(4):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        hog = bytearray(250 * 1024 * 1024)\n"
        "        for i in range(0, len(hog), 4096):\n"
        "            hog[i] = 1\n"
        "        import time\n"
        "        time.sleep(3)\n"
        "        os._exit(0)\n"
        "    kids.append(pid)\n"
        "killed = [pid for pid in kids if os.WIFSIGNALED(os.waitpid(pid, 0)[1])]\n"
        "if killed:\n"
        "    raise MemoryError(f'{len(killed)} children were killed')\n"
    )
    results = run_rollouts(
        request_for(
            script(spread), sandboxes=2, limits=SandboxLimits(rollout_timeout_s=25, batch_timeout_s=40, memory_mb=700)
        )
    )
    errors = [t["error"] for t in results[0].trajectories]
    assert all(e and "children were killed" in e and "memory limit of 700 MB" in e for e in errors), errors
    good_group_ok(results)


def test_it_survives_a_flood_on_the_result_pipe_within_its_deadline(request_for):
    flood = "fd = int(os.environ['ARTWEB_RESULT_FD'])\nchunk = b'x' * (1 << 20)\nwhile True:\n    os.write(fd, chunk)\n"
    started = time.monotonic()
    results = run_rollouts(
        request_for(script(flood), sandboxes=2, limits=SandboxLimits(rollout_timeout_s=3, batch_timeout_s=6))
    )
    assert time.monotonic() - started < 15
    assert all("broke artweb's result protocol" in t["error"] for t in results[0].trajectories)
    good_group_ok(results)


def test_it_fails_only_the_sandbox_that_garbles_the_result_stream(request_for):
    garble = (
        "fd = int(os.environ['ARTWEB_RESULT_FD'])\n"
        'os.write(fd, b\'{"kind": "trajectory", "group": 0, not json\\n\')\n'
        "await asyncio.sleep(5)\n"
    )
    results = run_rollouts(request_for(script(garble), sandboxes=2))
    assert all("not JSON" in t["error"] for t in results[0].trajectories)
    good_group_ok(results)


def test_it_refuses_forged_records(request_for):
    # A record for a group this sandbox does not own (group 1 runs in the other sandbox), then one with
    # token ids past the vocabulary and a NaN logprob for its own group.
    forge = (
        "fd = int(os.environ['ARTWEB_RESULT_FD'])\n"
        "rec = {'messages': [{'role': 'assistant', 'content': 'x', 'token_ids': [5, 10**9], "
        "'logprobs': [-0.1, -0.2]}], 'tools': None, 'reward': 1.0, 'metrics': {}, 'metadata': {}, "
        "'logs': [], 'error': None, 'duration_ms': 1, 'prompt_tokens': 1, 'completion_tokens': 2}\n"
        "os.write(fd, (json.dumps({'kind': 'trajectory', 'group': 0, 'index': 1, 'trajectory': rec}) + "
        "'\\n').encode())\n"
    )
    results = run_rollouts(request_for(script(forge), sandboxes=2, vocab_size=49152))
    forged = results[0].trajectories[1]
    assert forged["reward"] is None and "token id must be an integer in [0, 49152)" in forged["error"]
    # The real rollout of index 1 then arrives for a slot already taken: the sandbox is cut off.
    good_group_ok(results)

    steal = (
        "fd = int(os.environ['ARTWEB_RESULT_FD'])\n"
        "os.write(fd, (json.dumps({'kind': 'trajectory', 'group': 1, 'index': 0, 'trajectory': {}}) + "
        "'\\n').encode())\n"
        "await asyncio.sleep(5)\n"
    )
    results = run_rollouts(request_for(script(steal), sandboxes=2))
    assert all("not one of its groups" in t["error"] for t in results[0].trajectories)
    good_group_ok(results)


def test_a_done_line_forged_before_the_results_cuts_the_sandbox_off(request_for):
    # The worker stops reading a sandbox once it says "done" and kills it without waiting for its exit,
    # so a "done" written before its rollouts finished must not pass for a finished sandbox.
    forge = (
        "import builtins\n"
        "if not hasattr(builtins, 'forged'):  # once: a second line would be writing after done\n"
        "    builtins.forged = True\n"
        "    os.write(int(os.environ['ARTWEB_RESULT_FD']), b'{\"kind\": \"done\"}\\n')\n"
        "await asyncio.sleep(5)\n"
    )
    results = run_rollouts(request_for(script(forge), sandboxes=2))
    assert all("said it was done before it sent every result" in t["error"] for t in results[0].trajectories)
    good_group_ok(results)


@pytest.mark.slow  # about 20 s: each attack waits out its own limits
def test_it_keeps_other_batches_running_while_one_attacks(request_for):
    """Two batches at once, as two workers on one host would run them."""
    outcome = {}

    def run(name, source, **kwargs):
        outcome[name] = run_rollouts(request_for(source, **kwargs))

    bomb = "import ctypes\nlibc = ctypes.CDLL(None)\nwhile True:\n    libc.fork()"
    threads = [
        threading.Thread(
            target=run,
            args=("bad", script(bomb)),
            kwargs={"limits": SandboxLimits(rollout_timeout_s=10, max_processes=16)},
        ),
        threading.Thread(target=run, args=("good", script("await asyncio.sleep(1)"))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [t["reward"] for g in outcome["good"] for t in g.trajectories] == [1.0] * 4
    assert all(t["error"] for t in outcome["bad"][0].trajectories)


def test_it_removes_the_batchs_cgroups_when_it_ends(request_for):
    from rollouts.sandbox.cgroups import CGROUP_NAME, cgroup_layout

    comm = f"cg{uuid.uuid4().hex[:8]}"
    parents = [Path(v) for k, v in cgroup_layout("").items() if k != "v2"]
    assert parents and all(parent.name == CGROUP_NAME for parent in parents)
    ours: set[Path] = set()
    done = threading.Event()

    def find_ours():
        while not done.wait(0.05):
            pids = {str(p) for p in named(comm)}
            for parent in parents:
                for group in parent.iterdir():
                    try:
                        if pids & set((group / "cgroup.procs").read_text().split()):
                            ours.add(group)
                    except OSError:  # another batch's group, gone meanwhile
                        pass

    watcher = threading.Thread(target=find_ours)
    watcher.start()
    try:
        run_rollouts(request_for(script(rename(comm) + "await asyncio.sleep(1)"), group_size=1, scenarios=[{"i": 0}]))
    finally:
        done.set()
        watcher.join()
    assert len(ours) == len(parents)  # one per controller, while the batch ran
    assert not any(group.exists() for group in ours)


@pytest.mark.vllm
def test_it_passes_only_inference_routes_for_the_batchs_own_model(request_for, vllm_server):
    """Through the proxy, against the real vLLM server: the batch's model answers; vLLM's admin and
    development routes, another run's model name and the server's own port do not."""
    base = vllm_server.ensure_base()
    probe = (
        "import httpx\n"
        "url = os.environ['OPENAI_BASE_URL']\n"
        "root = url[:-3]\n"
        "c = httpx.Client(timeout=60)\n"
        f"out['own'] = c.post(url + '/chat/completions', json={{'model': {base!r}, 'max_tokens': 2, "
        "'messages': [{'role': 'user', 'content': 'hi'}]}).status_code\n"
        "out['other_model'] = c.post(url + '/chat/completions', json={'model': 'run-999@3', 'max_tokens': 2, "
        "'messages': [{'role': 'user', 'content': 'hi'}]}).status_code\n"
        "out['models'] = [m['id'] for m in c.get(url + '/models').json()['data']]\n"
        "for route in ['/collective_rpc', '/sleep', '/wake_up', '/reset_prefix_cache', '/v1/load_lora_adapter',\n"
        "              '/v1/unload_lora_adapter', '/metrics', '/tokenize', '/v1/embeddings', '/start_weight_update',\n"
        "              '/update_weights', '/finish_weight_update']:\n"
        "    out[route] = c.post(root + route, json={'lora_name': 'x', 'lora_path': '/etc', "
        "'method': 'reload_weights'}).status_code\n"
        f"s = socket.socket()\n"
        "s.settimeout(2)\n"
        "try:\n"
        f"    s.connect(('127.0.0.1', {vllm_server.port}))\n"
        "    out['direct'] = 'open'\n"
        "except OSError as e:\n"
        "    out['direct'] = type(e).__name__\n"
    )
    results = run_rollouts(
        request_for(report(probe), base_url=vllm_server.base_url, model_name=base, api_key=vllm_server.api_key)
    )
    out = results[0].trajectories[0]["metadata"]
    assert out.pop("own") == 200
    assert out.pop("other_model") == 404
    assert out.pop("models") == [base]
    assert out.pop("direct") == "ConnectionRefusedError"
    assert set(out.values()) == {404}, out
    good_group_ok(results)


def test_it_fails_closed_with_what_to_install_when_bubblewrap_is_missing(request_for, monkeypatch):
    from rollouts.sandbox import jail, process

    started = []
    monkeypatch.setattr(process.Sandbox, "start", lambda *a, **k: started.append(a))
    monkeypatch.setattr(jail.shutil, "which", lambda name: None)
    monkeypatch.setattr(jail, "BWRAP_FALLBACKS", ())
    jail.bwrap_path.cache_clear()
    jail.jail_check.cache_clear()
    try:
        with pytest.raises(jail.JailUnavailable, match=r"apt-get install bubblewrap"):
            run_rollouts(request_for(script("pass")))
    finally:
        jail.bwrap_path.cache_clear()
        jail.jail_check.cache_clear()
    assert started == []  # no user code ran


def test_it_builds_the_jail_under_the_workers_private_umask(request_for):
    """The launcher and the Docker start scripts run workers with umask 077."""
    previous = os.umask(0o077)
    try:
        results = run_rollouts(request_for(script("pass")))
    finally:
        os.umask(previous)
    assert [t["reward"] for g in results for t in g.trajectories] == [1.0] * 4


def test_it_binds_an_interpreter_that_lives_under_tmp_over_the_scratch(tmp_path):
    """A checkout (and its virtualenv) under /tmp must not vanish beneath the jail's private /tmp: the
    scratch is mounted first and the interpreter's directories on top of it."""
    from rollouts.sandbox import jail

    staged = [("/tmp/checkout/.venv", str(tmp_path / "0"), "/tmp/checkout/.venv")]
    args = jail._bwrap_args(staged, scratch_mb=8)
    assert args.index("--tmpfs") < args.index("/tmp/checkout/.venv")
    assert args[args.index("--tmpfs") + 1] == jail.SCRATCH


def test_it_tunnels_only_to_the_runs_own_tracing_service(request_for):
    """A run with Weave gets HTTPS tunnels (CONNECT) to its tracing service's host and port, and to no
    other: not PostgreSQL, not the same host on another port. The service listens on 127.0.0.1 here, which
    the egress guard allows only as the operator would, by that host and port (ARTWEB_EGRESS_ALLOW)."""
    import socketserver

    class Echo(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.sendall(self.request.recv(64))

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    probe = (
        "from urllib.parse import urlsplit\n"
        "proxy = urlsplit(os.environ['HTTPS_PROXY'])\n"
        "def tunnel(target):\n"
        "    s = socket.create_connection((proxy.hostname, proxy.port), timeout=10)\n"
        "    s.sendall(f'CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n'.encode())\n"
        "    status = s.recv(200).split(b' ')[1].decode()\n"
        "    if status == '200':\n"
        "        s.sendall(b'ping')\n"
        "        status += ':' + s.recv(10).decode()\n"
        "    return status\n"
        f"out['own'] = tunnel('127.0.0.1:{port}')\n"
        "out['postgres'] = tunnel('127.0.0.1:5432')\n"
        f"out['other_port'] = tunnel('127.0.0.1:{port + 1}')\n"
        "s = socket.socket()\n"
        "s.settimeout(2)\n"
        "try:\n"
        f"    s.connect(('127.0.0.1', {port}))\n"
        "    out['direct'] = 'open'\n"
        "except OSError as e:\n"
        "    out['direct'] = type(e).__name__\n"
    )
    try:
        from rollouts.sandbox.egress import EgressPolicy

        allowed = EgressPolicy.parse([f"127.0.0.1:{port}"])
        results = run_rollouts(request_for(report(probe), egress_hosts=(f"127.0.0.1:{port}",), egress_policy=allowed))
        plain = run_rollouts(request_for(report("out['proxy'] = os.environ.get('HTTPS_PROXY')")))
    finally:
        server.shutdown()
    out = results[0].trajectories[0]["metadata"]
    assert out == {"own": "200:ping", "postgres": "403", "other_port": "403", "direct": "ConnectionRefusedError"}
    assert plain[0].trajectories[0]["metadata"] == {"proxy": None}


def test_a_weave_target_at_the_hosts_redis_is_refused_when_saved(alice):
    """The first step of the Redis chain: a Weave target's base_url of http://127.0.0.1:6379 became a CONNECT
    allow-list entry of the run's batches. Such a target is now refused when saved."""
    from artweb.errors import ApplicationError
    from training.exports.services import export_target_create

    with pytest.raises(ApplicationError) as exc:
        export_target_create(
            owner=alice, kind="weave", settings={"project": "team/p", "base_url": "http://127.0.0.1:6379"}
        )
    assert "127.0.0.1 is a loopback address" in exc.value.message and "ARTWEB_EGRESS_ALLOW" in exc.value.message
    assert "settings.base_url" in exc.value.field_errors


def test_a_private_tracing_host_on_the_egress_list_gets_no_tunnel(request_for):
    """The Redis chain's second step: a script's `CONNECT 127.0.0.1:6379` through the egress socket got `200`
    and `+PONG` from the host's Redis. Should such a host reach a batch's egress list all the same (a target
    saved before the guard, a name pointed at 127.0.0.1 since), the tunnel is refused when it is opened:
    the batch's egress policy is the default one (public addresses, ports 443 and 80). A throwaway listener
    stands for the private service; it answers from outside the jail, so the refusal is the guard's, not a
    closed port's."""
    answered = []

    def serve(server: socket.socket) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                answered.append(conn.recv(64))
                conn.sendall(b"+PONG\r\n")

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    threading.Thread(target=serve, args=(server,), daemon=True).start()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as outside:  # reachable from outside the jail
        outside.sendall(b"PING\r\n")
        assert outside.recv(16) == b"+PONG\r\n"
    probe = (
        "from urllib.parse import urlsplit\n"
        "proxy = urlsplit(os.environ['HTTPS_PROXY'])\n"
        "def tunnel(target):\n"
        "    s = socket.create_connection((proxy.hostname, proxy.port), timeout=10)\n"
        "    s.sendall(f'CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n'.encode())\n"
        "    answer = s.recv(2000).decode()\n"
        "    if answer.startswith('HTTP/1.1 200'):\n"
        "        s.sendall(b'PING\\r\\n')\n"
        "        answer += s.recv(64).decode()\n"
        "    return answer\n"
        f"out['listener'] = tunnel('127.0.0.1:{port}')\n"
        "out['redis'] = tunnel('127.0.0.1:6379')\n"
        "out['metadata'] = tunnel('169.254.169.254:80')\n"
    )
    hosts = (f"127.0.0.1:{port}", "127.0.0.1:6379", "169.254.169.254:80")
    try:
        results = run_rollouts(request_for(report(probe), egress_hosts=hosts))
    finally:
        server.close()
    out = results[0].trajectories[0]["metadata"]
    assert out["listener"].startswith("HTTP/1.1 403") and "127.0.0.1 is a loopback address" in out["listener"]
    assert f"ARTWEB_EGRESS_ALLOW=127.0.0.1:{port}" in out["listener"] and "PONG" not in out["listener"]
    assert out["redis"].startswith("HTTP/1.1 403") and "+PONG" not in out["redis"]
    assert out["metadata"].startswith("HTTP/1.1 403") and "link-local" in out["metadata"]
    assert answered == [b"PING\r\n"]  # the one connection from outside; none through the tunnel


def test_the_weave_settings_open_only_weaves_hosts():
    from training.exports.weave import rollout_egress_hosts

    assert rollout_egress_hosts({}) == ()
    assert rollout_egress_hosts({"WEAVE_PROJECT": "team/p", "WANDB_API_KEY": "k"}) == (
        "api.wandb.ai:443",
        "trace.wandb.ai:443",
    )
    assert rollout_egress_hosts(
        {
            "WEAVE_PROJECT": "team/p",
            "WANDB_BASE_URL": "http://wandb.internal:8080",
            "WF_TRACE_SERVER_URL": "https://traces.internal",
        }
    ) == ("wandb.internal:8080", "traces.internal:443")
