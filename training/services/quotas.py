"""Per-user quotas: stored trajectory bytes, runs queued or running at once, training steps and GPU hours a day.

Staff set them per user or per group in the admin (training.models.Quota); where no row sets a limit, the
deployment's default applies (ARTWEB_QUOTA_* settings). A user's effective limit of each quota is their
own row's, else the most generous of their groups' rows', else the default (training.selectors.quota_limits).

Where each is enforced, and what is kept:
- runs queued or running: launching, resuming or retrying a run past the limit is refused with a 400 (a
  form error on the page) that names the limit. The user's row is locked while it is counted, so two
  launches at once cannot both take the last place.
- stored trajectories, steps a day and GPU hours a day (the seconds of the user's steps, Step.duration_s,
  in any 24 hours): checked by the worker when a step starts, before any of its work (run_step_execute). A
  step past any of them does not start: the run is paused, with an event saying which quota, the usage,
  the limit, when it frees and what to do. Nothing stored is touched. A step that started under the limits
  is stored whole, exactly once, as any step: stored bytes can pass their limit by one step's results
  (each batch of which the worker caps at SandboxLimits.batch_bytes), GPU hours by one step's time, and
  runs training at the same moment can each take the last step of the day.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from artweb.errors import ApplicationError
from rollouts.sandbox.records import record_size
from training.models import Run, Trajectory, TrajectoryGroup
from training.selectors import QuotaLine, quota_gpu_window_frees, quota_status, quota_steps_window_frees

QUOTA_EVENT = "quota_reached"
STEP_QUOTAS = ("trajectory_bytes", "steps_per_day", "gpu_seconds")  # the quotas a step start checks
# A stored trajectory's fields that were its record (what the step measured when it stored them).
STORED_FIELDS = (
    "messages",
    "tools",
    "reward",
    "metrics",
    "metadata",
    "logs",
    "error",
    "duration_ms",
    "prompt_tokens",
    "completion_tokens",
    "reward_ms",
)


def quota_check_run_start(*, user, actor=None) -> None:
    """Refuse one more run of `user` queued or running past their limit (`actor`: who asks, when not the
    user, e.g. a staff member resuming it). Call it inside the transaction that queues the run: it locks
    the user's row until then."""
    get_user_model().objects.select_for_update().filter(id=user.id).first()
    line = next(line for line in quota_status(user=user) if line.key == "concurrent_runs")
    if line.reached:
        you = actor is None or actor.pk == user.pk
        who, whose = ("You have", "your") if you else (f"{user.get_username()} has", "their")
        raise ApplicationError(
            f"{who} {line.used} runs queued or running, the limit of {whose} quota ({line.limit} at once, "
            f"{line.source}). Wait for one to finish, or pause or cancel one, and try again; an operator can "
            f"raise {whose} quota.",
            field_errors={"quota": ["concurrent_runs"]},
        )


def quota_step_refusal(*, user) -> QuotaLine | None:
    """The first quota that a new training step of this user would go past, if any."""
    return next((line for line in quota_status(user=user) if line.key in STEP_QUOTAS and line.reached), None)


def quota_reached_message(*, user, line: QuotaLine, step: int) -> str:
    """What the paused run's timeline says: which quota, the usage, the limit and what to do."""
    head = f"Paused before step {step}: "
    if line.key == "trajectory_bytes":
        body = (
            f"your runs' stored trajectories take {line.show(line.used)}, the limit of your storage quota "
            f"({line.show(line.limit)}, {line.source}). Ask an operator to raise your quota or to delete runs "
            "you no longer need, then resume the run."
        )
    elif line.key == "gpu_seconds":
        frees = quota_window_frees(user=user, line=line)
        when = f" after {_local(frees)}, when enough of that time is older than 24 hours," if frees else ""
        body = (
            f"your runs' training steps took {line.used_text} of GPU time in the last 24 hours, the limit of your "
            f"quota ({line.limit_text} a day, {line.source}). Resume the run{when} or ask an operator to raise "
            "your quota."
        )
    else:
        frees = quota_window_frees(user=user, line=line)
        when = f" after {_local(frees)}, when a step of the last 24 hours is older," if frees else ""
        body = (
            f"your runs trained {line.show(line.used)} steps in the last 24 hours, the limit of your quota "
            f"({line.show(line.limit)} steps a day, {line.source}). Resume the run{when} or ask an operator to "
            "raise your quota."
        )
    return head + body + " Everything the run stored is kept."


def quota_window_frees(*, user, line: QuotaLine):
    """When a quota of the last 24 hours that is reached frees: steps a day when its oldest step is older,
    GPU hours when enough step time is; None for the other quotas (or when it is not reached)."""
    if line.key == "gpu_seconds" and line.limit is not None:
        return quota_gpu_window_frees(user=user, limit_seconds=line.limit)
    if line.key == "steps_per_day":
        return quota_steps_window_frees(user=user)
    return None


def _lower_first(label: str) -> str:
    """ "Training steps ..." -> "training steps ...", but "GPU hours ..." stays."""
    return label if label[:2].isupper() else label[:1].lower() + label[1:]


def _local(moment) -> str:
    return f"{timezone.localtime(moment):%Y-%m-%d %H:%M %Z}"


@transaction.atomic
def run_quota_pause(*, run: Run, line: QuotaLine, step: int) -> bool:
    """Pause an active run whose next step a quota refuses, with an event that says why. Called by the
    worker before the step's work, so nothing of the step exists yet and the pause is immediate: the same
    conditional transition as run_pause's and the worker's own pause (run_pause would only flag a running
    run for after a step that is not going to run). False if the run was no longer active (cancelled or
    paused meanwhile); then nothing is written."""
    from training.services.runs import run_event, run_transition  # runs.py checks quotas too

    message = quota_reached_message(user=run.owner, line=line, step=step)
    paused = run_transition(
        run=run,
        from_statuses=Run.ACTIVE_STATUSES,
        to_status=Run.Status.PAUSED,
        message=f"Paused: the {_lower_first(line.label)} quota is reached.",
        worker="",
        pause_requested=False,
    )
    if paused:
        run_event(
            run=run,
            kind=QUOTA_EVENT,
            message=message,
            # level "warning": the run page shows it as a banner (training.selectors.run_warnings).
            data={
                "level": "warning",
                "quota": line.key,
                "used": line.used,
                "limit": line.limit,
                "source": line.source,
                "step": step,
            },
        )
    return paused


@transaction.atomic
def trajectory_bytes_recount(*, group_ids=(), run_ids=()) -> None:
    """Count stored bytes again after trajectories or groups were deleted outside the step that stored them
    (the admin): each of group_ids from its remaining trajectories, measured as records, then the runs of
    those groups and run_ids from their groups. Deleting a run needs none of this: its count goes with it."""
    groups = TrajectoryGroup.objects.select_for_update().filter(id__in=group_ids)
    run_ids = set(run_ids) | set(groups.values_list("run_id", flat=True))
    for group in groups:
        rows = Trajectory.objects.filter(group=group).values(*STORED_FIELDS)
        TrajectoryGroup.objects.filter(id=group.id).update(stored_bytes=sum(record_size(row) for row in rows))
    for run_id in run_ids:
        total = TrajectoryGroup.objects.filter(run_id=run_id).aggregate(total=Sum("stored_bytes"))["total"] or 0
        Run.objects.filter(id=run_id).update(trajectory_bytes=total)
