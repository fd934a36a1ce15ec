"""Per-user quotas: set per user or group, resolved field by field, shown, and enforced where they bite:
launching (runs at once) and the start of a step (stored trajectories, steps a day).

The step tests run run_step_execute as a GPU worker calls it, with test_step_service's stand-ins for the
vLLM server and the trainer (see its docstring); PostgreSQL, the jailed sandbox and Redis are real.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse
from django.utils import timezone

from artweb.errors import ApplicationError
from artweb.testing.factories import RunFactory, StepFactory
from rollouts.sandbox.records import record_size
from rollouts.sandbox.rollouts import GroupResult
from tests.training.services import test_step_service
from tests.training.services.test_step_service import execute, make_run
from training.models import Checkpoint, Quota, Run, RunEvent, Step, Trajectory, TrajectoryGroup
from training.selectors import quota_limits, quota_status, quota_usage
from training.services import run_create, run_resume, run_retry
from training.services.quotas import QUOTA_EVENT, STORED_FIELDS
from training.services.steps.groups import groups_persist

MB = 1 << 20
world = test_step_service.world  # the step tests' fixture: stand-ins for the vLLM server and the trainer


@pytest.fixture
def enqueued(monkeypatch):
    """Records run_step_task enqueues instead of sending them to a broker (no worker in these tests)."""
    from training import tasks

    calls = []
    monkeypatch.setattr(tasks.run_step_task, "apply_async", lambda args, kwargs: calls.append((args, kwargs)))
    return calls


def launch(owner, template: Run) -> Run:
    return run_create(
        owner=owner,
        name="one more",
        base_model=template.base_model,
        script_version=template.script_version,
        reward_version=template.reward_version,
        scenario_set=template.scenario_set,
        config={"num_steps": 3},
    )


# --- which limit applies ---------------------------------------------------------------------------------


def test_the_users_row_then_the_most_generous_group_then_the_default(alice, settings):
    settings.ARTWEB_QUOTA_TRAJECTORY_MB, settings.ARTWEB_QUOTA_CONCURRENT_RUNS, settings.ARTWEB_QUOTA_STEPS_PER_DAY = (
        100,
        3,
        50,
    )
    assert quota_limits(user=alice) == {
        "trajectory_mb": (100, "the default"),
        "concurrent_runs": (3, "the default"),
        "steps_per_day": (50, "the default"),
        "gpu_hours_per_day": (None, "the default"),
        "attachment_mb": (10240, "the default"),
    }
    small, large, open_ = (Group.objects.create(name=n) for n in ("small", "large", "open"))
    alice.groups.add(small, large, open_)
    Quota.objects.create(group=small, trajectory_mb=10, concurrent_runs=1)
    Quota.objects.create(group=large, trajectory_mb=500, concurrent_runs=2)
    Quota.objects.create(group=open_, steps_per_day=0)  # 0: no limit, more generous than any number
    Quota.objects.create(user=alice, concurrent_runs=7)  # her own row sets one field; the others fall through
    assert quota_limits(user=alice) == {
        "trajectory_mb": (500, 'group "large"'),
        "concurrent_runs": (7, "your own quota"),
        "steps_per_day": (None, 'group "open"'),
        "gpu_hours_per_day": (None, "the default"),
        "attachment_mb": (10240, "the default"),
    }


def test_a_quota_row_names_a_user_or_a_group_never_both(alice):
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        Quota.objects.create(user=alice, group=Group.objects.create(name="g"))
    with pytest.raises(IntegrityError), transaction.atomic():
        Quota.objects.create()


def test_usage_counts_the_users_own_runs_even_for_staff(alice, staff, settings):
    RunFactory(owner=alice, status=Run.Status.RUNNING, trajectory_bytes=3 * MB)
    RunFactory(owner=alice, status=Run.Status.PAUSED, trajectory_bytes=MB)
    StepFactory(run=RunFactory(owner=alice, status=Run.Status.COMPLETED, finished_at=timezone.now()))
    old = StepFactory(run=RunFactory(owner=alice, status=Run.Status.COMPLETED, finished_at=timezone.now()))
    Step.objects.filter(id=old.id).update(created_at=timezone.now() - timedelta(hours=25))
    used = {
        "trajectory_bytes": 4 * MB,
        "concurrent_runs": 1,
        "steps_per_day": 1,
        "gpu_seconds": 0,  # StepFactory's steps take no time
        "attachment_bytes": 0,
    }
    assert quota_usage(user=alice) == used
    # Staff see every run, but their quota counts theirs alone.
    assert quota_usage(user=staff) == dict.fromkeys(used, 0)


# --- runs at once ------------------------------------------------------------------------------------------


def test_launching_past_the_concurrent_runs_limit_is_refused_naming_it(alice, bob, settings, enqueued):
    settings.ARTWEB_QUOTA_CONCURRENT_RUNS = 2
    template = RunFactory(owner=alice, status=Run.Status.RUNNING)
    RunFactory(owner=alice, status=Run.Status.QUEUED)
    RunFactory(owner=alice, status=Run.Status.PAUSED)  # paused runs hold no place
    RunFactory(owner=bob, status=Run.Status.RUNNING)  # nor do anyone else's
    with pytest.raises(ApplicationError) as refused:
        launch(alice, template)
    assert refused.value.message.startswith(
        "You have 2 runs queued or running, the limit of your quota (2 at once, the default). Wait for one to "
        "finish, or pause or cancel one, and try again"
    )
    assert refused.value.field_errors == {"quota": ["concurrent_runs"]}
    assert Run.objects.filter(owner=alice).count() == 3 and enqueued == []

    Quota.objects.create(user=alice, concurrent_runs=3)  # an operator raises it
    assert launch(alice, template).status == Run.Status.QUEUED


def test_resuming_or_retrying_past_the_limit_is_refused_too(alice, staff, settings, enqueued):
    settings.ARTWEB_QUOTA_CONCURRENT_RUNS = 1
    RunFactory(owner=alice, status=Run.Status.RUNNING)
    paused, failed = (
        RunFactory(owner=alice, status=Run.Status.PAUSED),
        RunFactory(owner=alice, status=Run.Status.FAILED),
    )
    with pytest.raises(ApplicationError, match="You have 1 runs queued or running"):
        run_resume(run=paused, actor=alice)
    with pytest.raises(ApplicationError, match="alice has 1 runs queued or running, the limit of their quota"):
        run_retry(run=failed, actor=staff)
    paused.refresh_from_db()
    failed.refresh_from_db()
    assert (paused.status, failed.status) == (Run.Status.PAUSED, Run.Status.FAILED) and enqueued == []


def test_the_limit_of_zero_is_no_limit(alice, settings, enqueued):
    settings.ARTWEB_QUOTA_CONCURRENT_RUNS = 0
    template = RunFactory(owner=alice, status=Run.Status.RUNNING)
    RunFactory.create_batch(12, owner=alice, status=Run.Status.QUEUED)
    assert launch(alice, template).status == Run.Status.QUEUED


# --- a step's start: steps a day, stored trajectories ------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_step_past_the_steps_a_day_limit_pauses_the_run_and_keeps_what_it_stored(alice, world, settings):
    settings.ARTWEB_QUOTA_STEPS_PER_DAY = 1
    run = execute(make_run(alice), step=1)  # the day's one step, stored whole
    assert run.steps_done == 1 and run.trajectory_bytes > 0
    stored = (Step.objects.count(), Trajectory.objects.count(), Checkpoint.objects.count(), run.trajectory_bytes)

    run = execute(run, step=2)
    assert run.status == Run.Status.PAUSED and run.steps_done == 1 and run.worker == ""
    # Nothing of step 2 started, nothing of step 1 went, no step 2 is queued.
    assert not TrajectoryGroup.objects.filter(run=run, step=2).exists()
    assert (
        Step.objects.count(),
        Trajectory.objects.count(),
        Checkpoint.objects.count(),
        run.trajectory_bytes,
    ) == stored
    assert world.next_steps == [((run.id,), {"step": 2})] and len(world.updates) == 1
    event = RunEvent.objects.get(run=run, kind=QUOTA_EVENT)
    assert event.message.startswith(
        "Paused before step 2: your runs trained 1 steps in the last 24 hours, the limit of your quota (1 steps a "
        "day, the default). Resume the run after "
    )
    assert "or ask an operator to raise your quota. Everything the run stored is kept." in event.message
    assert event.data == {
        "level": "warning",
        "quota": "steps_per_day",
        "used": 1,
        "limit": 1,
        "source": "the default",
        "step": 2,
    }
    assert run.events.filter(kind="status", data__to=Run.Status.PAUSED).exists()

    # A day later (the step ages out of the window) the run resumes and trains its step 2.
    Step.objects.filter(run=run).update(created_at=timezone.now() - timedelta(hours=25))
    run_resume(run=run, actor=alice)
    run = execute(run, step=2)
    assert run.status == Run.Status.RUNNING and run.steps_done == 2


@pytest.mark.django_db(transaction=True)
def test_a_step_past_the_stored_trajectories_limit_pauses_the_run(alice, world, settings):
    Quota.objects.create(user=alice, trajectory_mb=1)
    RunFactory(owner=alice, status=Run.Status.COMPLETED, trajectory_bytes=MB + 1)  # an older run's trajectories
    run = execute(make_run(alice), step=1)
    assert run.status == Run.Status.PAUSED and run.steps_done == 0 and run.worker == ""
    assert not TrajectoryGroup.objects.filter(run=run).exists() and world.updates == []
    event = RunEvent.objects.get(run=run, kind=QUOTA_EVENT)
    assert event.message == (
        "Paused before step 1: your runs' stored trajectories take 1.0\xa0MB, the limit of your storage quota "
        "(1.0\xa0MB, your own quota). Ask an operator to raise your quota or to delete runs you no longer need, "
        "then resume the run. Everything the run stored is kept."
    )
    assert event.data["quota"] == "trajectory_bytes" and event.data["limit"] == MB


# --- what is counted -----------------------------------------------------------------------------------------


def trajectory(content: str) -> dict:
    return {
        "messages": [{"role": "user", "content": content}],
        "tools": None,
        "reward": 1.0,
        "metrics": {},
        "metadata": {},
        "logs": [],
        "error": None,
        "duration_ms": 1,
        "prompt_tokens": 0,
        "completion_tokens": 0,
    }


def test_stored_bytes_are_counted_as_the_worker_measures_and_a_replaced_attempt_is_taken_back(alice):
    run = RunFactory(owner=alice, status=Run.Status.RUNNING, worker="w")
    scenarios = list(run.scenario_set.scenarios.filter(split="train")[:2])
    first = [GroupResult(s, [trajectory("a" * 1000), trajectory("b")]) for s in scenarios]
    groups_persist(run, 1, "train", scenarios, first, me="w")
    size = sum(record_size(t) for r in first for t in r.trajectories)
    run.refresh_from_db()
    assert run.trajectory_bytes == size == sum(g.stored_bytes for g in TrajectoryGroup.objects.filter(run=run))

    # A second attempt at the same step replaces the first's groups: their bytes go with them.
    again = [GroupResult(s, [trajectory("c"), trajectory("d")]) for s in scenarios]
    groups_persist(run, 1, "train", scenarios, again, me="w")
    run.refresh_from_db()
    assert run.trajectory_bytes == sum(record_size(t) for r in again for t in r.trajectories) < size


# --- where people see them ---------------------------------------------------------------------------------


def test_the_runs_page_shows_usage_against_each_limit(client, alice, settings):
    settings.ARTWEB_QUOTA_CONCURRENT_RUNS = 1
    RunFactory(owner=alice, status=Run.Status.RUNNING, trajectory_bytes=3 * MB)
    client.force_login(alice)
    page = client.get(reverse("run-list")).content.decode()
    assert "Stored trajectories: <strong>3.0\xa0MB</strong> of 10.0\xa0GB" in page
    assert "Runs queued or running: <strong>1</strong> of 1" in page
    assert "Training steps in the last 24 hours: <strong>0</strong> of 5,000" in page
    assert 'data-quota-reached="concurrent_runs"' in page and "a new one can start when one finishes" in page


def test_staff_edit_quotas_in_the_admin_and_see_the_usage(client, staff, alice):
    RunFactory(owner=alice, status=Run.Status.RUNNING, trajectory_bytes=2 * MB)
    client.force_login(staff)
    response = client.post(
        reverse("admin:training_quota_add"),
        {"user": alice.id, "trajectory_mb": "50", "concurrent_runs": "", "steps_per_day": "0", "note": "pilot"},
    )
    assert response.status_code == 302, response.content.decode()[-2000:]
    quota = Quota.objects.get(user=alice)
    assert (quota.trajectory_mb, quota.concurrent_runs, quota.steps_per_day) == (50, None, 0)
    listing = client.get(reverse("admin:training_quota_changelist")).content.decode()
    assert "2.0\xa0MB of 50.0\xa0MB; 1 of 8; 0 of no limit; 0 h of no limit; 0\xa0bytes of 10.0\xa0GB" in listing
    page = client.get(reverse("admin:training_quota_change", args=[quota.id])).content.decode()
    assert "Runs queued or running: 1 of 8" in page and "(the default)" in page
    assert [(q.key, q.limit) for q in quota_status(user=alice)] == [
        ("trajectory_bytes", 50 * MB),
        ("concurrent_runs", 8),
        ("steps_per_day", None),
        ("gpu_seconds", None),
        ("attachment_bytes", 10240 * MB),
    ]


def test_deleting_trajectories_or_groups_in_the_admin_counts_the_bytes_again(client, staff, alice):
    run = RunFactory(owner=alice, status=Run.Status.COMPLETED, worker="w")
    scenarios = list(run.scenario_set.scenarios.filter(split="train")[:2])
    results = [GroupResult(s, [trajectory("a" * 5000), trajectory("b")]) for s in scenarios]
    first, second = groups_persist(run, 1, "train", scenarios, results, me="w")
    client.force_login(staff)

    big = Trajectory.objects.get(group=first, index=0)
    response = client.post(
        reverse("admin:training_trajectory_changelist"),
        {"action": "delete_selected", "_selected_action": [big.id], "post": "yes"},
    )
    assert response.status_code == 302 and not Trajectory.objects.filter(id=big.id).exists()
    run.refresh_from_db()
    first.refresh_from_db()
    (left,) = Trajectory.objects.filter(group=first).values(*STORED_FIELDS)
    assert first.stored_bytes == record_size(left) < 1000  # the 5,000-character one is no longer counted
    assert run.trajectory_bytes == first.stored_bytes + second.stored_bytes

    response = client.post(reverse("admin:training_trajectorygroup_delete", args=[second.id]), {"post": "yes"})
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.trajectory_bytes == first.stored_bytes

    # A run goes whole, its count with it.
    response = client.post(reverse("admin:training_run_delete", args=[run.id]), {"post": "yes"})
    assert response.status_code == 302 and not Run.objects.filter(id=run.id).exists()
