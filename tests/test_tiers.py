"""The markers say what a test starts (tests/fixtures/tiers.py): the fixtures that start a server, a browser
or a worker mark the tests that use them, and a process started by a test that does not carry its marker
is refused, so `-m "not vllm"` (and `make test-fast`) never starts one."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.fixtures.tiers import markers_needed, processes_started

ROOT = Path(__file__).resolve().parents[1]


class _Item:
    """What the plugin reads of a collected test: its fixtures' closure and its markers."""

    def __init__(self, *fixturenames: str, marks=()):
        self.fixturenames = list(fixturenames)
        self.marks = {mark.name: mark for mark in marks}

    def get_closest_marker(self, name):
        return self.marks.get(name)


def test_the_fixtures_a_test_uses_name_its_markers():
    assert set(markers_needed(_Item("db", "asgi_server", "browser", "page"))) == {"browser"}
    assert set(markers_needed(_Item("transactional_db", "serving_worker", "vllm_server"))) == {"vllm"}
    assert set(markers_needed(_Item("ct2_server"))) == {"ct2"}
    engine = pytest.mark.inference_engine("ctranslate2").mark
    assert set(markers_needed(_Item("stack_env", "procs", marks=[engine]))) == {"worker", "ct2"}
    assert markers_needed(_Item("db", "client", "alice", "tmp_path")) == {}


@pytest.mark.parametrize(
    ("command", "started"),
    [
        (["/venv/bin/python", "/repo/rollouts/inference/vllm_entry.py", "--model", "m"], {"vllm"}),
        (["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], {"vllm"}),
        (["python", "-m", "rollouts.inference.ct2_entry", "--model", "m"], {"ct2"}),
        (["python", "-m", "celery", "-A", "artweb", "worker", "-Q", "gpu"], {"worker"}),
        ("/venv/bin/celery -A artweb worker -Q default", {"worker"}),
        (["/pw/driver/node", "/pw/driver/package/cli.js", "run-driver"], {"browser"}),
        (["/usr/bin/chromium", "--headless"], {"browser"}),
        # What is not one of them: the ASGI server, vLLM's interpreter probe, a celery command that is no worker.
        (["python", "-m", "uvicorn", "artweb.testing.asgi:application"], set()),
        (["python", "-c", "import importlib.metadata as metadata"], set()),
        (["python", "-m", "celery", "-A", "artweb", "inspect", "ping"], set()),
    ],
)
def test_it_tells_the_processes_a_marker_stands_for(command, started):
    assert set(processes_started(command)) == started


INNER = textwrap.dedent("""
    import subprocess
    import sys

    import pytest

    # "celery ... worker" as arguments of an interpreter that exits at once: counted as a worker, starts none.
    WORKER = [sys.executable, "-c", "pass", "celery", "worker"]


    @pytest.fixture
    def vllm_server():
        return "a stand-in under the real fixture's name: nothing starts"


    def test_uses_the_server(vllm_server):
        pass


    def test_starts_nothing():
        subprocess.run([sys.executable, "-c", "pass"], check=True)


    @pytest.mark.worker
    def test_starts_a_worker_and_says_so():
        subprocess.run(WORKER, check=True)


    def test_starts_a_worker_unmarked():
        subprocess.run(WORKER, check=True)
""")


def test_a_run_without_vllm_leaves_its_users_out_and_an_unmarked_start_fails(tmp_path):
    """A pytest run of its own with only this plugin, on a module of four tests."""
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.fixtures.tiers",
            "-m",
            "not vllm",
            "-rA",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    outcomes = {
        line.split()[1].split("::")[1]: line.split()[0]
        for line in proc.stdout.splitlines()
        if line.startswith(("PASSED ", "FAILED ", "ERROR "))
    }
    assert outcomes == {
        "test_starts_nothing": "PASSED",
        "test_starts_a_worker_and_says_so": "PASSED",
        "test_starts_a_worker_unmarked": "FAILED",
    }, proc.stdout
    assert "1 deselected" in proc.stdout  # test_uses_the_server: marked vllm by its fixture
    assert 'starts a Celery worker without @pytest.mark.worker: mark it, so that -m "not worker"' in proc.stdout
