"""The "send a test event" action: one real event through the exporter's own code, and a clear answer
either way, noted on the target.

A Langfuse server cannot run here, so the local recording endpoint answers as Langfuse documents;
W&B's success is checked offline (the files the real wandb client writes); its failure, and Weave's,
against a port nothing listens on.
"""

import base64
import importlib.util
import time

import pytest

from artweb.errors import ApplicationError
from artweb.launcher.embedded import free_port
from tests.egress import egress_allow
from tests.exports.wandb_files import read_run
from training.exports.services import export_target_create, export_target_test
from training.models import ExportTarget

LANGFUSE_SECRET = "sk-lf-secret-5678"
WANDB_KEY = "wandbkey" + "w" * 32


@pytest.fixture
def dead_url(settings) -> str:
    """A local port nothing listens on, which the egress guard lets the test reach."""
    return egress_allow(settings, f"http://127.0.0.1:{free_port()}")


@pytest.fixture
def fast_wandb(monkeypatch, tmp_path):
    import wandb

    import training.exports.wandb as wandb_export

    monkeypatch.setattr(wandb_export, "TEST_INIT_TIMEOUT_S", 3.0)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    wandb.teardown()  # wandb reads the environment once per session
    yield tmp_path
    wandb.teardown()


def test_it_sends_one_langfuse_trace_and_notes_the_success(alice, recording_server):
    target = export_target_create(
        owner=alice,
        kind="langfuse",
        secret=LANGFUSE_SECRET,
        settings={"host": recording_server.url, "public_key": "pk-lf-public"},
    )
    result = export_target_test(target=target, actor=alice)

    assert result.ok and f"Langfuse at {recording_server.url} accepted a test trace" in result.message
    (request,) = recording_server.requests
    assert request["path"] == "/api/public/ingestion"
    assert (
        request["headers"]["Authorization"]
        == "Basic " + base64.b64encode(f"pk-lf-public:{LANGFUSE_SECRET}".encode()).decode()
    )
    (event,) = recording_server.events()
    assert event["type"] == "trace-create" and event["body"]["name"] == "artweb connection test"
    target.refresh_from_db()
    assert target.last_success_at and target.last_error == ""


def test_it_reports_an_unreachable_langfuse_at_once(alice, dead_url):
    url = dead_url
    target = export_target_create(
        owner=alice, kind="langfuse", secret=LANGFUSE_SECRET, settings={"host": url, "public_key": "pk"}
    )
    started = time.perf_counter()
    result = export_target_test(target=target, actor=alice)
    assert time.perf_counter() - started < 10
    assert not result.ok
    assert result.message.startswith(f"Langfuse at {url} is unreachable: ConnectError")
    assert LANGFUSE_SECRET not in result.message
    target.refresh_from_db()
    assert target.last_error == f"Test event: {result.message}" and target.last_error_at


@pytest.mark.parametrize(
    "status, reply, says",
    [
        (401, {"message": "Invalid credentials"}, "refused the keys (HTTP 401); check the public and secret key"),
        (
            207,
            {"successes": [], "errors": [{"id": "x", "status": 400, "message": "Invalid request data"}]},
            "rejected 1 of 1 events; first: HTTP 400 Invalid request data",
        ),
    ],
)
def test_it_passes_on_langfuses_refusal(alice, recording_server, status, reply, says):
    recording_server.status, recording_server.reply = status, reply
    target = export_target_create(
        owner=alice,
        kind="langfuse",
        secret=LANGFUSE_SECRET,
        settings={"host": recording_server.url, "public_key": "pk"},
    )
    result = export_target_test(target=target, actor=alice)
    assert not result.ok and says in result.message


def test_a_later_success_clears_the_error(alice, recording_server):
    recording_server.status, recording_server.reply = 503, {}
    target = export_target_create(
        owner=alice,
        kind="langfuse",
        secret=LANGFUSE_SECRET,
        settings={"host": recording_server.url, "public_key": "pk"},
    )
    assert not export_target_test(target=target, actor=alice).ok
    recording_server.status, recording_server.reply = 207, None
    assert export_target_test(target=target, actor=alice).ok
    target.refresh_from_db()
    assert target.last_error == "" and target.last_error_at is None


def test_it_logs_a_wandb_test_run_offline(alice, fast_wandb):
    target = export_target_create(owner=alice, kind="wandb", settings={"project": "artweb-tests", "mode": "offline"})
    result = export_target_test(target=target, actor=alice)
    assert result.ok and "offline" in result.message, result.message
    run_id = result.message.split("test run ", 1)[1].split(" ", 1)[0]
    wb = read_run(fast_wandb, run_id)
    assert wb["run"].display_name == "artweb connection test" and wb["run"].project == "artweb-tests"
    assert wb["history"][0]["artweb/test_event"] == 1


@pytest.mark.slow
def test_it_reports_an_unreachable_wandb_server(alice, fast_wandb, dead_url):
    target = export_target_create(
        owner=alice, kind="wandb", secret=WANDB_KEY, settings={"project": "p", "base_url": dead_url}
    )
    result = export_target_test(target=target, actor=alice)
    assert not result.ok
    assert result.message.startswith("W&B refused the test run: CommError")
    assert "connection refused" in result.message.lower()
    assert WANDB_KEY not in result.message


@pytest.mark.slow
def test_it_reports_an_unreachable_weave_server(alice, dead_url):
    """Real weave, in a process of its own (so not imported here); it answers within seconds when
    nothing listens. weave is a dependency of artweb: without it this fails, never skips."""
    assert importlib.util.find_spec("weave") is not None, "weave, a dependency of artweb, is not installed"
    target = export_target_create(
        owner=alice, kind="weave", secret=WANDB_KEY, settings={"project": "team/agents", "base_url": dead_url}
    )
    result = export_target_test(target=target, actor=alice)
    assert not result.ok and result.message.startswith("Weave refused the test trace:"), result.message
    assert WANDB_KEY not in result.message


def test_nobody_tests_someone_elses_target(alice, bob, dead_url):
    target = export_target_create(
        owner=alice, kind="langfuse", secret=LANGFUSE_SECRET, settings={"host": dead_url, "public_key": "pk"}
    )
    with pytest.raises(ApplicationError, match="not yours"):
        export_target_test(target=target, actor=bob)
    assert ExportTarget.objects.get(id=target.id).last_error == ""
