"""Langfuse: every trajectory of every step as a trace, through Langfuse's documented batch ingestion
HTTP API (POST /api/public/ingestion, basic auth with the public and secret key).

A trace holds the conversation (input: the messages before the last reply; output: the last reply),
one generation per assistant turn (its tool calls included), one span per tool result, the reward
(and advantage) as scores, and run, step, group and split as metadata. Ids are derived from the
trajectory, so sending a step again overwrites rather than duplicates.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import timedelta

import httpx
from django.conf import settings
from django.utils import timezone

from rollouts.sandbox.egress import EgressRefused, egress_client, failure_reason
from training.exports.base import ExportError, ExportJob
from training.models import Run, Trajectory
from training.selectors import CLIENT_TASK

DEFAULT_HOST = "https://cloud.langfuse.com"
# The ingestion endpoint accepts batches up to about 3.5 MB; stay well below.
BATCH_BYTES = 2_000_000
CONTENT_LIMIT = 100_000  # characters kept of one message's content
TIMEOUT_S = 30.0


TEST_TIMEOUT_S = 15.0  # a person waits on the page for a test event's answer


def langfuse_endpoint(cfg, secret: str, *, worker_env: bool) -> tuple[str, str, str]:
    """(host, public_key, secret_key): the settings, then (the operator's own targets only) the worker's
    environment. Anyone else's target never borrows the operator's keys or sends its keys elsewhere."""
    env = os.environ if worker_env else {}
    host = cfg.host or env.get("LANGFUSE_HOST", "").rstrip("/") or DEFAULT_HOST
    public = cfg.public_key or env.get("LANGFUSE_PUBLIC_KEY", "")
    if not public or not secret:
        where = (
            ", or set LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY in the worker's environment"
            if worker_env
            else " (the Exports page, or `artweb exports edit ID --set public_key=pk-lf-… --secret`)"
        )
        missing = ", ".join(n for n, v in (("public key", public), ("secret key", secret)) if not v)
        raise ExportError(
            f"Langfuse needs a public and a secret key (missing: {missing}): enter them in the export settings{where}."
        )
    return host, public, secret


def _client(host: str, public: str, secret: str, timeout: float) -> httpx.Client:
    # Every connection through the egress guard: the host is a user's choice, reached from our network.
    return egress_client(
        settings.ARTWEB_EGRESS,
        base_url=host,
        auth=(public, secret),
        timeout=timeout,
        headers={"User-Agent": "artweb-exporter"},
    )


def langfuse_export(job: ExportJob) -> None:
    host, public, secret = langfuse_endpoint(job.settings, job.secret, worker_env=job.worker_env)
    if not job.progress.remote_id:
        # Namespaces the ids, so two installations sending to one project never collide.
        job.progress.remote_id = str(uuid.uuid4())
        job.progress.save(update_fields=["remote_id", "updated_at"])
    namespace = uuid.UUID(job.progress.remote_id)
    with _client(host, public, secret, TIMEOUT_S) as client:
        for step in job.steps:
            trajs = Trajectory.objects.filter(run=job.run, step=step.step, group__failed_attempt=False).select_related(
                "group", "group__scenario"
            )
            if not job.settings.include_validation:
                trajs = trajs.filter(group__split="train")
            events = []
            for traj in trajs.order_by("group_id", "index"):
                events.extend(trajectory_events(job.run, traj, namespace))
            for batch in _batches(events):
                _send(client, host, batch)
            job.done(step.step)


def langfuse_test_event(*, cfg, secret: str, worker_env: bool, timeout: float | None = None) -> str:
    """Send one trace, named "artweb connection test", through the export's own request; return what
    Langfuse said. Raises ExportError with Langfuse's answer."""
    host, public, secret = langfuse_endpoint(cfg, secret, worker_env=worker_env)
    now = timezone.now()
    trace_id = str(uuid.uuid4())
    trace = {
        "id": trace_id,
        "name": "artweb connection test",
        "timestamp": now.isoformat(),
        "tags": ["artweb", "test"],
        "metadata": {"artweb_test": True},
        "input": "A test event sent from artweb's export settings.",
        "output": "ok",
    }
    with _client(host, public, secret, timeout or TEST_TIMEOUT_S) as client:
        _send(
            client,
            host,
            [{"id": str(uuid.uuid4()), "type": "trace-create", "timestamp": now.isoformat(), "body": trace}],
        )
    return f"Langfuse at {host} accepted a test trace ({trace_id})."


def _uid(namespace: uuid.UUID, *parts) -> str:
    return str(uuid.uuid5(namespace, ":".join(str(p) for p in parts)))


def _clip(message: dict) -> dict:
    content = message.get("content")
    if isinstance(content, str) and len(content) > CONTENT_LIMIT:
        message = {**message, "content": content[:CONTENT_LIMIT] + "…"}
    return message


def trajectory_events(run: Run, traj: Trajectory, namespace: uuid.UUID) -> list[dict]:
    """The ingestion events of one trajectory: a trace, its observations and its scores."""
    messages = [_clip(m) for m in (traj.messages or []) if isinstance(m, dict)]
    end = traj.group.created_at
    start = end - timedelta(milliseconds=traj.duration_ms or 0)
    trace_id = _uid(namespace, "trace", traj.id)
    events = [_event(namespace, "trace-create", _trace(run, traj, trace_id, messages, start), start)]
    events += _observations(run, traj, namespace, trace_id, messages, start, end)
    if traj.error:
        error = {
            "id": _uid(namespace, "error", traj.id),
            "traceId": trace_id,
            "name": "rollout error",
            "startTime": end.isoformat(),
            "level": "ERROR",
            "statusMessage": traj.error[:5000],
        }
        events.append(_event(namespace, "event-create", error, end))
    for name, value in (("reward", traj.reward), ("advantage", traj.advantage)):
        if value is not None:
            score = {
                "id": _uid(namespace, "score", name, traj.id),
                "traceId": trace_id,
                "name": name,
                "value": float(value),
                "dataType": "NUMERIC",
            }
            events.append(_event(namespace, "score-create", score, end))
    return events


def _trace(run: Run, traj: Trajectory, trace_id: str, messages: list[dict], start) -> dict:
    """The trace: the conversation up to the last reply as input, that reply as output."""
    last_reply = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    split = traj.group.split
    metadata = {
        "artweb_run_id": run.id,
        "run_name": run.name,
        "step": traj.step,
        "split": split,
        "group_id": traj.group_id,
        "index": traj.index,
        "scenario_index": traj.group.scenario.index,
        "advantage": traj.advantage,
        "prompt_tokens": traj.prompt_tokens,
        "completion_tokens": traj.completion_tokens,
        "duration_ms": traj.duration_ms,
        "metrics": traj.metrics or {},
        "metadata": traj.metadata or {},
    }
    if traj.error:
        metadata["error"] = traj.error[:5000]
    if traj.tools:
        metadata["tools"] = traj.tools
    return {
        "id": trace_id,
        "name": f"{run.name} · step {traj.step}",
        "timestamp": start.isoformat(),
        "sessionId": f"artweb-run-{run.id}",
        "input": messages[:last_reply] if last_reply is not None else messages,
        "output": messages[last_reply] if last_reply is not None else None,
        "metadata": metadata,
        "tags": ["artweb", split, f"step:{traj.step}"] + (["error"] if traj.error else []),
        # What produced the trace: the script's version, or (a client-driven run) the ART client.
        "release": str(run.script_version) if run.script_version else CLIENT_TASK,
    }


def _observations(run, traj, namespace: uuid.UUID, trace_id: str, messages: list[dict], start, end) -> list[dict]:
    """One generation per assistant turn, then one span per tool result (named after its call)."""
    events = []
    calls_by_id: dict[str, dict] = {}
    replies = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    for turn, i in enumerate(replies):
        m = messages[i]
        for call in m.get("tool_calls") or []:
            if isinstance(call, dict) and call.get("id"):
                calls_by_id[call["id"]] = call
        gen = {
            "id": _uid(namespace, "generation", traj.id, i),
            "traceId": trace_id,
            "name": f"turn {turn + 1}",
            "startTime": start.isoformat(),
            "endTime": end.isoformat(),
            "model": run.base_model.name,
            "input": messages[:i],
            "output": m,
            "metadata": {"message_index": i},
        }
        if len(replies) == 1:
            gen["usageDetails"] = {"input": traj.prompt_tokens, "output": traj.completion_tokens}
        events.append(_event(namespace, "generation-create", gen, start))
    for i, m in enumerate(messages):
        if m.get("role") != "tool":
            continue
        call = calls_by_id.get(m.get("tool_call_id") or "") or {}
        fn = call.get("function") or {}
        span = {
            "id": _uid(namespace, "tool", traj.id, i),
            "traceId": trace_id,
            "name": f"tool {fn.get('name') or m.get('name') or ''}".strip(),
            "startTime": start.isoformat(),
            "endTime": end.isoformat(),
            "input": fn.get("arguments"),
            "output": m.get("content"),
            "metadata": {"message_index": i, "tool_call_id": m.get("tool_call_id")},
        }
        events.append(_event(namespace, "span-create", span, start))
    return events


def _event(namespace: uuid.UUID, kind: str, body: dict, when) -> dict:
    # The event id deduplicates deliveries of the same event; the body id makes it an upsert.
    return {"id": _uid(namespace, "event", kind, body["id"]), "type": kind, "timestamp": when.isoformat(), "body": body}


def _batches(events: list[dict]):
    batch, size = [], 0
    for event in events:
        n = len(json.dumps(event, default=str))
        if batch and size + n > BATCH_BYTES:
            yield batch
            batch, size = [], 0
        batch.append(event)
        size += n
    if batch:
        yield batch


def _send(client: httpx.Client, host: str, batch: list[dict]) -> None:
    payload = {"batch": batch, "metadata": {"sdk_name": "artweb", "sent_at": timezone.now().isoformat()}}
    try:
        resp = client.post(
            "/api/public/ingestion",
            content=json.dumps(payload, default=str),
            headers={"Content-Type": "application/json"},
        )
    except EgressRefused as exc:
        raise ExportError(f"Langfuse at {host} cannot be used: {exc}") from exc
    except httpx.HTTPError as exc:
        raise ExportError(f"Langfuse at {host} is unreachable: {failure_reason(exc)}.") from exc
    if resp.status_code in (401, 403):
        raise ExportError(
            f"Langfuse at {host} refused the keys (HTTP {resp.status_code}); check the public and secret key."
        )
    if resp.status_code >= 300 and resp.status_code != 207:
        # Its status line only: the body of an answer that is not Langfuse's is nobody's business here.
        raise ExportError(f"Langfuse at {host} answered HTTP {resp.status_code} {resp.reason_phrase[:100]}.")
    try:
        answer = resp.json()
    except ValueError:
        answer = None
    errors = answer.get("errors") if isinstance(answer, dict) else None
    if errors and isinstance(errors, list):
        # Langfuse's documented answer (207, per-event results): its first error's status and message.
        first = errors[0] if isinstance(errors[0], dict) else {}
        raise ExportError(
            f"Langfuse at {host} rejected {len(errors)} of {len(batch)} events; first: "
            f"HTTP {first.get('status')} {first.get('message') or first.get('error') or ''}"[:500]
        )
