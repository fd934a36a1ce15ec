"""/metrics: protected, and every value it shows matches the database (and the broker's queues)."""

import uuid
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from artweb.testing.factories import RunFactory, StepFactory, TrajectoryFactory, TrajectoryGroupFactory
from training import prometheus as metrics
from training.models import Run, Trajectory


def scrape(client, **headers) -> dict:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture
def queues(monkeypatch):
    """Two queues of our own on the real broker (the shared "default"/"gpu" lists have live consumers)."""
    names = (f"obs-test-{uuid.uuid4().hex[:8]}", f"obs-test-{uuid.uuid4().hex[:8]}")
    monkeypatch.setattr(metrics, "QUEUES", names)
    r = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    yield r, names
    for name in names:
        r.delete(name, *(f"{name}\x06\x16{p}" for p in (3, 6, 9)))


@pytest.fixture
def activity(alice, bob):
    now = timezone.now()
    running = RunFactory(
        owner=alice, status="running", steps_done=2, worker="gpu-1:42", heartbeat_at=now - timedelta(seconds=7)
    )
    queued = RunFactory(owner=bob, status="queued")
    RunFactory(owner=alice, status="completed", steps_done=3)
    RunFactory(owner=alice, status="failed")
    StepFactory(
        run=running,
        step=1,
        metrics={"rollouts": 8, "rollout_errors": 1, "completion_tokens_total": 400},
        timings={"rollouts": 4.0},
        duration_s=30.0,
    )
    StepFactory(
        run=running,
        step=2,
        metrics={"rollouts": 8, "rollout_errors": 0, "completion_tokens_total": 600},
        timings={"rollouts": 2.0},
        duration_s=12.5,
    )
    group = TrajectoryGroupFactory(run=running, step=2)
    for i, ms in enumerate((100, 200, 300, 400)):
        TrajectoryFactory(group=group, index=i, duration_ms=ms, error="boom" if i == 3 else "")
    old = TrajectoryGroupFactory(run=running, step=1)
    type(old).objects.filter(id=old.id).update(created_at=now - timedelta(hours=1))
    TrajectoryFactory(group=old, index=0, duration_ms=99_000)  # outside the window
    return {"running": running, "queued": queued}


def test_it_refuses_anonymous_and_non_staff_and_wrong_tokens(client, alice, settings):
    settings.ARTWEB_METRICS_TOKEN = "scrape-token-123"
    response = client.get("/metrics")
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope").status_code == 403
    client.force_login(alice)
    assert client.get("/metrics").status_code == 403


def test_no_token_configured_means_no_token_works(client, settings):
    settings.ARTWEB_METRICS_TOKEN = ""
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 403


def test_a_staff_session_or_the_bearer_token_may_scrape(client, staff, settings, activity, queues):
    settings.ARTWEB_METRICS_TOKEN = "scrape-token-123"
    assert scrape(client, HTTP_AUTHORIZATION="Bearer scrape-token-123")
    client.force_login(staff)
    assert scrape(client)


def test_the_values_match_the_database(client, staff, activity, queues):
    r, (q1, q2) = queues
    day_old = StepFactory(run=RunFactory(owner=activity["running"].owner, status="completed"), duration_s=900.0)
    type(day_old).objects.filter(id=day_old.id).update(created_at=timezone.now() - timedelta(hours=25))
    r.rpush(q1, "a", "b", "c")
    r.rpush(f"{q1}\x06\x163", "d")  # a priority sub-queue counts toward its queue
    r.rpush(q2, "e")
    client.force_login(staff)
    m = scrape(client)

    for status in Run.Status.values:
        assert m[("artweb_runs", (("status", status),))] == Run.objects.filter(status=status).count()
    assert m[("artweb_runs", (("status", "running"),))] == 1
    assert m[("artweb_steps_completed_total", ())] == 3
    assert m[("artweb_rollouts_total", ())] == 16
    assert m[("artweb_rollout_errors_total", ())] == 1
    assert m[("artweb_completion_tokens_total", ())] == 1000
    assert m[("artweb_rollout_tokens_per_second", ())] == pytest.approx(1000 / 6.0)
    run_id = str(activity["running"].id)
    assert m[("artweb_run_tokens_per_second", (("run_id", run_id),))] == pytest.approx(600 / 2.0)
    assert m[("artweb_run_steps_done", (("run_id", run_id),))] == 2
    assert m[("artweb_run_steps_done", (("run_id", str(activity["queued"].id)),))] == 0

    # The window holds the four recent rollouts, not the hour-old one.
    assert Trajectory.objects.count() == 5
    assert m[("artweb_rollouts_recent", ())] == 4
    assert m[("artweb_rollout_errors_recent", ())] == 1
    assert m[("artweb_rollout_latency_seconds", (("quantile", "0.5"),))] == pytest.approx(0.25)
    assert m[("artweb_rollout_latency_seconds", (("quantile", "0.99"),))] == pytest.approx(0.397)
    assert m[("artweb_rollout_latency_seconds_mean", ())] == pytest.approx(0.25)

    # Each user's step time of the last 24 hours: alice's two steps; bob's queued run has none yet.
    alice_id, bob_id = str(activity["running"].owner_id), str(activity["queued"].owner_id)
    assert m[("artweb_user_step_seconds_24h", (("user_id", alice_id),))] == pytest.approx(42.5)
    assert ("artweb_user_step_seconds_24h", (("user_id", bob_id),)) not in m

    age = m[("artweb_run_heartbeat_age_seconds", (("run_id", run_id), ("worker", "gpu-1:42")))]
    assert 7 <= age < 60
    assert m[("artweb_workers_busy", ())] == 1
    assert m[("artweb_queue_depth", (("queue", q1),))] == 4
    assert m[("artweb_queue_depth", (("queue", q2),))] == 1
    assert m[("artweb_broker_up", ())] == 1


def test_a_broker_outage_is_a_metric_not_a_failed_scrape(client, staff, settings, activity):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    client.force_login(staff)
    m = scrape(client)
    assert m[("artweb_broker_up", ())] == 0
    assert m[("artweb_runs", (("status", "running"),))] == 1


def test_failing_exports_are_counted(client, staff, alice):
    from training.exports.services import export_target_create

    target = export_target_create(owner=alice, kind="langfuse")
    type(target).objects.filter(id=target.id).update(last_error="down")
    client.force_login(staff)
    m = scrape(client)
    assert m[("artweb_export_targets_failing", (("kind", "langfuse"),))] == 1
    assert m[("artweb_export_targets_failing", (("kind", "wandb"),))] == 0
