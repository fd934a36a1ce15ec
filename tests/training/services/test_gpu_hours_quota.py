"""The GPU-hours-a-day quota: the seconds of a user's training steps (Step.duration_s) in any 24 hours, set per
user or group (hours, fractions allowed), shown wherever quotas show, and enforced where a step starts: the
run pauses before the step, with an event naming the quota, the usage, the limit and when it frees.

The step tests run run_step_execute as a GPU worker calls it, with test_step_service's stand-ins for the vLLM
server and the trainer (see its docstring); PostgreSQL, the jailed sandbox and Redis are real.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse
from django.utils import timezone

from artweb.testing.factories import RunFactory, StepFactory
from tests.client_runs import test_services as client_tests
from tests.client_runs.test_services import error
from tests.training.services import test_step_service
from tests.training.services.test_step_service import execute, make_run
from training.client_runs.models import ClientTrainingJob
from training.models import Quota, Run, RunEvent, Step, TrajectoryGroup
from training.selectors import quota_gpu_window_frees, quota_limits, quota_status, quota_usage
from training.selectors_quotas import hours_text
from training.services import run_resume
from training.services.quotas import QUOTA_EVENT

HOUR = 3600
world = test_step_service.world  # the step tests' fixture: stand-ins for the vLLM server and the trainer
base_model, art, sent = client_tests.base_model, client_tests.art, client_tests.sent  # the ART client's fixtures


def stepped(owner, seconds: float, *, ago: timedelta, run: Run | None = None) -> Step:
    """A step of `seconds` recorded `ago` (of a finished run of `owner`'s unless `run` is given)."""
    run = run or RunFactory(owner=owner, status=Run.Status.COMPLETED, finished_at=timezone.now())
    step = StepFactory(run=run, duration_s=seconds)
    Step.objects.filter(id=step.id).update(created_at=timezone.now() - ago)
    step.refresh_from_db()
    return step


def gpu_line(user):
    return next(line for line in quota_status(user=user) if line.key == "gpu_seconds")


@pytest.mark.django_db
def test_it_counts_the_seconds_of_the_users_steps_of_the_last_24_hours(alice, bob, settings):
    settings.ARTWEB_QUOTA_GPU_HOURS_PER_DAY = 2.5
    stepped(alice, 3000, ago=timedelta(hours=23))
    stepped(alice, 2400.4, ago=timedelta(minutes=5))
    stepped(alice, 9999, ago=timedelta(hours=25))  # older than a day
    stepped(bob, 7000, ago=timedelta(hours=1))  # not hers
    assert quota_usage(user=alice)["gpu_seconds"] == 5400
    line = gpu_line(alice)
    assert (line.used, line.limit, line.reached, line.source) == (5400, 9000, False, "the default")
    assert (line.label, line.used_text, line.limit_text) == ("GPU hours in the last 24 hours", "1.5 h", "2.5 h")
    assert [hours_text(s) for s in (0, 10, 36, 900, 45 * HOUR, 1_000_000 * HOUR)] == [
        "0 h",
        "< 0.01 h",
        "0.01 h",
        "0.25 h",
        "45 h",
        "1,000,000 h",
    ]


@pytest.mark.django_db
def test_the_limit_is_the_users_row_else_the_most_generous_group_else_the_default(alice, settings):
    settings.ARTWEB_QUOTA_GPU_HOURS_PER_DAY = 4
    assert quota_limits(user=alice)["gpu_hours_per_day"] == (4, "the default")
    small, large = Group.objects.create(name="small"), Group.objects.create(name="large")
    alice.groups.add(small, large)
    Quota.objects.create(group=small, gpu_hours_per_day=0.5)
    Quota.objects.create(group=large, gpu_hours_per_day=12)
    assert quota_limits(user=alice)["gpu_hours_per_day"] == (12, 'group "large"')
    Quota.objects.create(user=alice, gpu_hours_per_day=0.25)
    assert quota_limits(user=alice)["gpu_hours_per_day"] == (0.25, "your own quota")
    assert gpu_line(alice).limit == 900
    Quota.objects.filter(user=alice).update(gpu_hours_per_day=0)
    assert gpu_line(alice).limit is None  # 0: no limit


@pytest.mark.django_db
def test_it_frees_when_enough_of_the_days_step_time_is_older_than_24_hours(alice):
    first = stepped(alice, 1000, ago=timedelta(hours=23))
    second = stepped(alice, 2000, ago=timedelta(hours=22))
    stepped(alice, 1000, ago=timedelta(hours=1))
    assert quota_gpu_window_frees(user=alice, limit_seconds=3500) == first.created_at + timedelta(hours=24)
    assert quota_gpu_window_frees(user=alice, limit_seconds=2500) == second.created_at + timedelta(hours=24)
    assert quota_gpu_window_frees(user=alice, limit_seconds=5000) is None  # under it already


@pytest.mark.django_db(transaction=True)
def test_a_step_past_the_gpu_hours_limit_pauses_the_run_and_says_when_it_frees(alice, world, settings):
    settings.ARTWEB_QUOTA_GPU_HOURS_PER_DAY = 1
    old = stepped(alice, 3000, ago=timedelta(hours=23))
    stepped(alice, 700, ago=timedelta(minutes=30))
    run = execute(make_run(alice), step=1)

    assert run.status == Run.Status.PAUSED and run.steps_done == 0 and run.worker == ""
    assert not TrajectoryGroup.objects.filter(run=run).exists() and world.updates == [] and world.next_steps == []
    event = RunEvent.objects.get(run=run, kind=QUOTA_EVENT)
    frees = timezone.localtime(old.created_at + timedelta(hours=24))
    assert event.message == (
        "Paused before step 1: your runs' training steps took 1.03 h of GPU time in the last 24 hours, the limit "
        f"of your quota (1 h a day, the default). Resume the run after {frees:%Y-%m-%d %H:%M %Z}, when enough of "
        "that time is older than 24 hours, or ask an operator to raise your quota. Everything the run stored is kept."
    )
    assert event.data == {
        "level": "warning",
        "quota": "gpu_seconds",
        "used": 3700,
        "limit": 3600,
        "source": "the default",
        "step": 1,
    }
    status = run.events.get(kind="status", data__to=Run.Status.PAUSED)
    assert status.message == "Paused: the GPU hours in the last 24 hours quota is reached."

    # The old step leaves the day: the run resumes and trains.
    Step.objects.filter(id=old.id).update(created_at=timezone.now() - timedelta(hours=25))
    run_resume(run=run, actor=alice)
    run = execute(run, step=1)
    assert run.status == Run.Status.RUNNING and run.steps_done == 1


@pytest.mark.django_db(transaction=True)
def test_a_step_that_starts_under_the_limit_is_recorded_whole(alice, world, settings):
    """The check is at a step's start: the step that takes the user past the limit is stored, the next pauses."""
    Quota.objects.create(user=alice, gpu_hours_per_day=1)
    run = make_run(alice)
    stepped(alice, 3599.4, ago=timedelta(minutes=30))  # counted as 3599 s: under by a second
    run = execute(run, step=1)
    assert run.steps_done == 1 and run.status == Run.Status.RUNNING
    run = execute(run, step=2)
    assert run.status == Run.Status.PAUSED and run.steps_done == 1
    assert RunEvent.objects.get(run=run, kind=QUOTA_EVENT).data["source"] == "your own quota"


@pytest.mark.django_db
def test_an_art_clients_job_past_it_is_refused_naming_it(art, alice, settings, sent):
    settings.ARTWEB_QUOTA_GPU_HOURS_PER_DAY = 0.5
    model = art.register()
    old = stepped(alice, 1800, ago=timedelta(hours=2))
    response = art.train(model["id"])
    assert response.status_code == 429
    frees = timezone.localtime(old.created_at + timedelta(hours=24))
    assert error(response) == (
        "The training job was refused: your runs' training steps took 0.5 h of GPU time in the last 24 hours, the "
        f"limit of your quota (0.5 h a day, the default). Train again after {frees:%Y-%m-%d %H:%M %Z}, or ask an "
        "operator to raise it. Nothing of it was stored."
    )
    assert not ClientTrainingJob.objects.exists() and sent == []


@pytest.mark.django_db
def test_it_shows_on_the_runs_page_and_the_api(client, alice, settings):
    settings.ARTWEB_QUOTA_GPU_HOURS_PER_DAY = 2
    stepped(alice, 5400, ago=timedelta(hours=3))
    client.force_login(alice)
    page = client.get(reverse("run-list")).content.decode()
    assert "GPU hours in the last 24 hours: <strong>1.5 h</strong> of 2 h" in page
    lines = client.get("/api/v1/quota/").json()["quotas"]
    assert {
        "key": "gpu_seconds",
        "label": "GPU hours in the last 24 hours",
        "used": 5400,
        "limit": 7200,
        "reached": False,
        "source": "the default",
    } in lines


@pytest.mark.django_db
def test_staff_set_gpu_hours_and_share_weights_in_the_admin(client, staff, alice):
    stepped(alice, 1800, ago=timedelta(hours=1))
    client.force_login(staff)
    add = reverse("admin:training_quota_add")
    form = {"user": alice.id, "gpu_hours_per_day": "1.5", "share_weight": "2.5", "note": "pilot"}
    assert client.post(add, form).status_code == 302
    quota = Quota.objects.get(user=alice)
    assert (quota.gpu_hours_per_day, quota.share_weight) == (1.5, 2.5)
    listing = client.get(reverse("admin:training_quota_changelist")).content.decode()
    assert "0.5 h of 1.5 h" in listing
    page = client.get(reverse("admin:training_quota_change", args=[quota.id])).content.decode()
    assert "GPU hours in the last 24 hours: 0.5 h of 1.5 h" in page
    assert "Share weight: 2.5 <span class='help'>(your own quota)</span>" in page

    group_form = {"group": Group.objects.create(name="g").id, "share_weight": "0", "gpu_hours_per_day": "-1"}
    refused = client.post(add, group_form).content.decode()
    assert "Give a share weight above 0 (2 gets twice the GPU time of a user at 1), or leave it empty for 1." in refused
    assert "Give 0 (no limit) or more hours." in refused
    assert Quota.objects.count() == 1
