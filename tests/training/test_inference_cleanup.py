"""Merged copies of the weights (hundreds of MB each) that inference servers write to the temporary
directory: removed when the server stops, when its worker is stopped with SIGTERM, and, for those of a
worker that died without stopping it, by the retention sweep after each step.

No vLLM runs here: the servers are stand-ins (InferenceServer running a sleeping process) whose work
directories hold real files, which is all the cleanup looks at. The SIGTERM test starts a real Celery
worker with a prefork pool, as the launcher and the Docker image start a GPU worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from artweb.testing.factories import RunFactory
from rollouts.inference.inference_server import InferenceServer
from training.services.checkpoints import checkpoint_apply_retention

REPO = Path(__file__).resolve().parents[2]


class StandIn(InferenceServer):
    def command(self) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(600)"]

    def environment(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def merged_copy(server: InferenceServer) -> Path:
    """A merged copy as load_adapter writes one, in the server's work directory."""
    copy = server.work_dir / "merged" / "run-1@1"
    copy.mkdir(parents=True)
    (copy / "model.safetensors").write_bytes(b"\0" * (1 << 20))
    return copy


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state not in "ZX"


@pytest.fixture
def tmp_dir(tmp_path, monkeypatch):
    """The temporary directory, for this process and the processes it starts."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def test_stopping_a_server_removes_its_merged_copies(tmp_dir):
    server = StandIn("/nonexistent/model")
    server.start(wait=False)
    copy = merged_copy(server)
    pid = server._proc.pid
    server.stop()
    assert not copy.exists() and list(tmp_dir.iterdir()) == []
    assert not alive(pid)


def _leave_a_copy_behind(env: dict) -> Path:
    """A process that makes a server's merged copy and dies without stopping it (as a worker killed with
    SIGKILL, or by the OOM killer, does); returns the copy's work directory."""
    code = (
        "import os, sys\n"
        "sys.path.insert(0, os.getcwd())\n"
        "from rollouts.inference.inference_server import InferenceServer\n"
        "server = InferenceServer('/nonexistent/model')\n"
        "copy = server.work_dir / 'merged' / 'run-1@1'\n"
        "copy.mkdir(parents=True)\n"
        "(copy / 'model.safetensors').write_bytes(bytes(1 << 20))\n"
        "print(server.work_dir, flush=True)\n"
        "os._exit(0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def test_the_retention_sweep_removes_copies_whose_owner_is_gone_and_keeps_the_rest(tmp_dir, db):
    left = _leave_a_copy_behind({**os.environ, "TMPDIR": str(tmp_dir)})
    assert (left / "merged" / "run-1@1" / "model.safetensors").is_file()
    live = StandIn("/nonexistent/model")  # this process's own server: in use, kept
    mine = merged_copy(live)
    other = tmp_dir / "artweb-inference-notapid"  # a name that says no owner: never guessed at
    other.mkdir()
    outside = tmp_dir / "elsewhere"
    outside.mkdir()
    (outside / "keep").write_text("x")
    link = tmp_dir / "artweb-inference-1-1-link"  # a link named like a dead owner's directory
    link.symlink_to(outside)
    try:
        checkpoint_apply_retention(run=RunFactory())  # what a step's commit runs on the worker
        assert not left.exists()
        assert mine.is_dir() and other.is_dir() and (outside / "keep").is_file() and link.is_symlink()
    finally:
        live.stop()


def test_the_sweep_tells_a_reused_pid_from_the_owner(tmp_dir):
    from rollouts.inference.work_dirs import work_dir_create, work_dirs_remove_orphaned

    mine = work_dir_create()
    pid, started = mine.name.split("-")[2:4]
    assert pid == str(os.getpid())
    # The same pid with another start time: a process that took the dead owner's pid.
    reused = tmp_dir / f"artweb-inference-{pid}-{int(started) + 1}-abcd1234"
    reused.mkdir()
    assert work_dirs_remove_orphaned() == [reused]
    assert mine.is_dir()


@pytest.mark.worker
def test_sigterm_to_a_prefork_worker_removes_its_servers_copies(tmp_dir, tmp_path_factory):
    started = tmp_path_factory.mktemp("marker") / "started.json"
    env = {
        **os.environ,
        "TMPDIR": str(tmp_dir),
        "ARTWEB_TEST_STARTED": str(started),
        "ARTWEB_SWEEP_SECONDS": "0",  # this worker is here to be stopped, not to sweep the database
        "DJANGO_SETTINGS_MODULE": "artweb.settings",
        "PYTHONPATH": str(REPO),
    }
    log = tmp_path_factory.mktemp("log") / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "tests.training.celery_shutdown_app", "worker"),
                *("--pool", "prefork", "--concurrency", "1", "-Q", f"cleanup-test-{uuid.uuid4().hex}"),
                *("--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"),
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 90
        while not started.exists() and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert started.exists(), log.read_text()[-4000:]
        time.sleep(0.5)  # the file is written last; let it be whole
        info = json.loads(started.read_text())
        work_dir = Path(info["work_dir"])
        assert (work_dir / "merged" / "run-1@1" / "model.safetensors").is_file() and alive(info["server"])

        worker.send_signal(signal.SIGTERM)  # a warm shutdown, as `docker stop` or the launcher asks for
        assert worker.wait(timeout=60) == 0, log.read_text()[-4000:]
        assert not work_dir.exists(), log.read_text()[-4000:]
        assert not alive(info["server"]) and not alive(info["child"])
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
