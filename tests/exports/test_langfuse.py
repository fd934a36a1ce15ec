"""Langfuse export through its batch ingestion HTTP API.

A real Langfuse server (a web app with PostgreSQL, ClickHouse, Redis and object storage) cannot run
here, so a local HTTP endpoint records the ingestion requests and answers as Langfuse documents
(207 with per-event successes and errors); the tests check the payloads it received.
"""

import base64
from types import SimpleNamespace

import pytest

from tests.egress import egress_allow
from training.exports.base import ExportError
from training.exports.services import export_sync, export_target_create
from training.models import ExportProgress, ExportTarget, RunEvent


@pytest.fixture
def langfuse_target(run_with_steps, recording_server):
    return export_target_create(
        owner=run_with_steps.owner,
        kind="langfuse",
        secret="sk-lf-secret-1234",
        settings={"host": recording_server.url, "public_key": "pk-lf-public"},
    )


def test_it_sends_each_trajectory_as_a_trace_with_tool_calls_and_reward_scores(
    run_with_steps, recording_server, langfuse_target
):
    run = run_with_steps
    assert export_sync(target_id=langfuse_target.id, run_id=run.id) == 2

    req = recording_server.requests[0]
    assert req["path"] == "/api/public/ingestion"
    assert req["headers"]["Authorization"] == "Basic " + base64.b64encode(b"pk-lf-public:sk-lf-secret-1234").decode()
    traces = recording_server.events("trace-create")
    assert len(traces) == 5  # 2 + 2 training trajectories, 1 validation
    trace = traces[0]["body"]
    assert trace["sessionId"] == f"artweb-run-{run.id}"
    assert trace["metadata"]["artweb_run_id"] == run.id and trace["metadata"]["step"] == 1
    assert trace["metadata"]["split"] == "train" and trace["metadata"]["run_name"] == "capitals"
    assert trace["input"][1] == {"role": "user", "content": "What is the capital of France?"}
    assert trace["output"] == {"role": "assistant", "content": "Paris"}
    assert sorted(t["body"]["metadata"]["split"] for t in traces) == ["train"] * 4 + ["validation"]

    mine = [e["body"] for e in recording_server.events() if e["body"].get("traceId") == trace["id"]]
    generations = [b for b in mine if "model" in b]
    assert len(generations) == 2  # two assistant turns
    assert generations[0]["output"]["tool_calls"][0]["function"]["name"] == "lookup"
    tool = next(b for b in mine if b["name"] == "tool lookup")
    assert tool["input"] == '{"q": "France"}' and tool["output"] == "Paris"
    scores = {b["name"]: b["value"] for b in mine if "value" in b}
    assert scores == {"reward": 1.0, "advantage": 0.5}
    assert ExportProgress.objects.get(target=langfuse_target, run=run).last_step == 2


def test_sending_again_overwrites_instead_of_duplicating(run_with_steps, recording_server, langfuse_target):
    run = run_with_steps
    export_sync(target_id=langfuse_target.id, run_id=run.id)
    first = {e["body"]["id"] for e in recording_server.events("trace-create")}
    ExportProgress.objects.filter(target=langfuse_target, run=run).update(last_step=0)  # as if never acknowledged
    recording_server.requests.clear()
    export_sync(target_id=langfuse_target.id, run_id=run.id)
    assert {e["body"]["id"] for e in recording_server.events("trace-create")} == first


@pytest.mark.parametrize(
    "status, reply, says",
    [
        (401, {"message": "Invalid credentials"}, "refused the keys"),
        (207, {"successes": [], "errors": [{"id": "x", "status": 400, "message": "Invalid request data"}]}, "rejected"),
        (503, {}, "HTTP 503"),
    ],
)
def test_a_refusal_is_recorded_on_the_target_and_the_run_timeline(
    run_with_steps, recording_server, langfuse_target, status, reply, says
):
    run = run_with_steps
    recording_server.status, recording_server.reply = status, reply
    with pytest.raises(ExportError, match=says):
        export_sync(target_id=langfuse_target.id, run_id=run.id)
    with pytest.raises(ExportError):
        export_sync(target_id=langfuse_target.id, run_id=run.id)

    target = ExportTarget.objects.get(id=langfuse_target.id)
    assert says in target.last_error and target.last_error_at
    assert "sk-lf-secret-1234" not in target.last_error
    progress = ExportProgress.objects.get(target=target, run=run)
    assert progress.failures == 2 and progress.last_step == 0
    warnings = RunEvent.objects.filter(run=run, kind="export_warning")
    assert warnings.count() == 1  # once per new error, not once per attempt
    assert "Langfuse export failed" in warnings[0].message and "not affected" in warnings[0].message

    recording_server.status, recording_server.reply = 207, None
    assert export_sync(target_id=langfuse_target.id, run_id=run.id) == 2
    target.refresh_from_db()
    assert target.last_error == "" and target.last_success_at
    assert RunEvent.objects.filter(run=run, kind="export_recovered").count() == 1


def test_an_unreachable_service_is_an_export_error(run_with_steps, settings):
    from artweb.launcher.embedded import free_port

    target = export_target_create(
        owner=run_with_steps.owner,
        kind="langfuse",
        secret="sk-lf-secret-1234",
        settings={"host": egress_allow(settings, f"http://127.0.0.1:{free_port()}"), "public_key": "pk"},
    )
    with pytest.raises(ExportError, match="unreachable"):
        export_sync(target_id=target.id, run_id=run_with_steps.id)


def test_keys_come_from_the_worker_environment_when_none_are_stored(
    run_with_steps, recording_server, monkeypatch, staff
):
    """Only for the operator's own (staff) targets: see tests/exports/test_worker_env.py for everyone else's."""
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk-env")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-env")
    monkeypatch.setenv("LANGFUSE_HOST", recording_server.url)
    target = export_target_create(owner=staff, kind="langfuse", run=run_with_steps)
    export_sync(target_id=target.id, run_id=run_with_steps.id)
    assert (
        recording_server.requests[0]["headers"]["Authorization"]
        == "Basic " + base64.b64encode(b"pk-env:sk-env").decode()
    )


def test_without_any_key_it_says_where_to_put_one(run_with_steps, monkeypatch, staff):
    monkeypatch.delenv("LANGFUSE_SECRET_KEY", raising=False)
    monkeypatch.delenv("LANGFUSE_PUBLIC_KEY", raising=False)
    target = export_target_create(owner=run_with_steps.owner, kind="langfuse")
    with pytest.raises(ExportError, match="enter them in the export settings") as exc:
        export_sync(target_id=target.id, run_id=run_with_steps.id)
    assert "LANGFUSE_SECRET_KEY" not in str(exc.value)  # not an option for alice's target
    operators = export_target_create(owner=staff, kind="langfuse", run=run_with_steps)
    with pytest.raises(ExportError, match="LANGFUSE_SECRET_KEY"):
        export_sync(target_id=operators.id, run_id=run_with_steps.id)


def test_trajectory_events_mark_errors():
    import uuid
    from datetime import UTC, datetime

    from training.exports.langfuse import trajectory_events

    run = SimpleNamespace(id=1, name="r", script_version="s v1", base_model=SimpleNamespace(name="m"))
    group = SimpleNamespace(
        created_at=datetime(2026, 1, 1, tzinfo=UTC), split="train", scenario=SimpleNamespace(index=3)
    )
    traj = SimpleNamespace(
        id=9,
        step=2,
        index=0,
        group=group,
        group_id=4,
        messages=[{"role": "user", "content": "q"}],
        tools=None,
        reward=None,
        advantage=None,
        metrics={},
        metadata={},
        error="Boom",
        prompt_tokens=0,
        completion_tokens=0,
        duration_ms=5,
    )
    events = trajectory_events(run, traj, uuid.uuid4())
    kinds = [e["type"] for e in events]
    assert kinds == ["trace-create", "event-create"]  # no reply, no reward: no generation, no score
    assert events[0]["body"]["output"] is None and "error" in events[0]["body"]["tags"]
    assert events[1]["body"]["level"] == "ERROR" and events[1]["body"]["statusMessage"] == "Boom"
