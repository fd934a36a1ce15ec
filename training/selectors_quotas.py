"""Reads for quotas (training.services.quotas) and share weights (the fair queue: training.selectors_queue).

A quota limits what a user's own runs use, whoever looks: a staff member sees every run (run_visible) but is
counted for theirs alone, so these reads filter on the owner, never through run_visible. training.selectors
re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import F, FloatField, Func, Min, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.template.defaultfilters import filesizeformat
from django.utils import timezone

from rollouts.models import DataAttachment
from training.models import Quota, Run, Step

QUOTA_WINDOW = timedelta(hours=24)  # "a day" of the steps-a-day and GPU-hours quotas: any 24 hours
HOUR = 3600


def hours_text(seconds: float) -> str:
    """Seconds as hours a person reads: "1.5 h", "12 h", "0.25 h"; under a hundredth, "< 0.01 h"."""
    if 0 < seconds < 36:
        return "< 0.01 h"
    return f"{seconds / HOUR:,.2f}".rstrip("0").rstrip(".") + " h"


@dataclass(frozen=True)
class QuotaLine:
    """One quota of a user: what they use against what they may (limit None: no limit)."""

    key: str  # "trajectory_bytes", "concurrent_runs", "steps_per_day", "gpu_seconds" or "attachment_bytes"
    label: str  # what people read
    used: int  # in the key's unit: bytes (*_bytes), seconds (gpu_seconds), runs or steps
    limit: int | None
    source: str  # where the limit comes from: "your own quota", 'group "research"', "the default"

    @property
    def reached(self) -> bool:
        return self.limit is not None and self.used >= self.limit

    def show(self, n: int | None) -> str:
        if n is None:
            return "no limit"
        if self.key.endswith("_bytes"):
            return filesizeformat(n)
        return hours_text(n) if self.key.endswith("_seconds") else f"{n:,}"

    @property
    def used_text(self) -> str:
        return self.show(self.used)

    @property
    def limit_text(self) -> str:
        return self.show(self.limit)


# Quota field -> (the line's key, its label, the setting of the deployment's default, the line's units per
# unit of the field: bytes per MB, seconds per hour).
QUOTA_FIELDS = {
    "trajectory_mb": ("trajectory_bytes", "Stored trajectories", "ARTWEB_QUOTA_TRAJECTORY_MB", 1 << 20),
    "concurrent_runs": ("concurrent_runs", "Runs queued or running", "ARTWEB_QUOTA_CONCURRENT_RUNS", 1),
    "steps_per_day": ("steps_per_day", "Training steps in the last 24 hours", "ARTWEB_QUOTA_STEPS_PER_DAY", 1),
    "gpu_hours_per_day": ("gpu_seconds", "GPU hours in the last 24 hours", "ARTWEB_QUOTA_GPU_HOURS_PER_DAY", HOUR),
    "attachment_mb": ("attachment_bytes", "Data attachments", "ARTWEB_QUOTA_ATTACHMENT_MB", 1 << 20),
}


def quota_limits(*, user) -> dict[str, tuple[int | float | None, str]]:
    """The user's limit of each quota and where it comes from, field by field: the user's own row when it
    sets the field, else the most generous of their groups' rows that set it, else the deployment's
    default. A limit of 0 is no limit (None here); limits are in the field's unit (MB, runs, steps, hours)."""
    rows = list(Quota.objects.filter(Q(user=user) | Q(group__in=user.groups.all())).select_related("group"))
    own = next((r for r in rows if r.user_id == user.id), None)
    limits = {}
    for field in QUOTA_FIELDS:
        if own is not None and getattr(own, field) is not None:
            value, source = getattr(own, field), "your own quota"
        elif grants := [
            (getattr(r, field), r.group.name) for r in rows if r.group_id and getattr(r, field) is not None
        ]:
            # The most generous group: no limit (0) above any number.
            value, name = max(grants, key=lambda grant: (grant[0] == 0, grant[0]))
            source = f'group "{name}"'
        else:
            value, source = getattr(settings, QUOTA_FIELDS[field][2]), "the default"
        limits[field] = (value or None, source)
    return limits


def subquery_total(qs: QuerySet, function: str, field: str, zero=0) -> Coalesce:
    """SUM or COUNT of a field over qs, as a subquery that is 0 over no rows (not an aggregate: no GROUP BY)."""
    return Coalesce(Subquery(qs.order_by().annotate(n=Func(F(field), function=function)).values("n")), zero)


def quota_usage(*, user) -> dict[str, int]:
    """What the user's own runs use now: stored trajectory bytes, runs queued or running, training steps
    committed in the last QUOTA_WINDOW and those steps' seconds; and the bytes of their data attachments.
    One query."""
    since = timezone.now() - QUOTA_WINDOW
    runs = Run.objects.filter(owner=user)
    # A run that finished before the window has no step in it: only the others' steps are looked at.
    recent = runs.filter(Q(finished_at__isnull=True) | Q(finished_at__gte=since)).values("id")
    steps = Step.objects.filter(run__in=recent, created_at__gte=since)
    usage = (
        get_user_model()
        .objects.filter(id=user.id)
        .values(
            trajectory_bytes=subquery_total(runs, "SUM", "trajectory_bytes"),
            concurrent_runs=subquery_total(runs.filter(status__in=Run.ACTIVE_STATUSES), "COUNT", "id"),
            steps_per_day=subquery_total(steps, "COUNT", "id"),
            gpu_seconds=subquery_total(steps, "SUM", "duration_s", zero=Value(0.0, output_field=FloatField())),
            # Each of the user's attachments in full, even where another row holds the same stored bytes.
            attachment_bytes=subquery_total(DataAttachment.objects.filter(owner=user), "SUM", "size"),
        )
        .get()
    )
    return {key: int(round(value)) for key, value in usage.items()}


def quota_status(*, user) -> list[QuotaLine]:
    """The user's quotas, each with its usage: what the runs page, the API and the admin show."""
    limits, usage = quota_limits(user=user), quota_usage(user=user)
    lines = []
    for field, (key, label, _, unit) in QUOTA_FIELDS.items():
        limit, source = limits[field]
        lines.append(QuotaLine(key, label, usage[key], None if limit is None else int(round(limit * unit)), source))
    return lines


def quota_steps_window_frees(*, user) -> datetime | None:
    """When the oldest training step of the user's last QUOTA_WINDOW leaves it (a step a day is free again)."""
    since = timezone.now() - QUOTA_WINDOW
    oldest = Step.objects.filter(run__owner=user, created_at__gte=since).aggregate(oldest=Min("created_at"))["oldest"]
    return oldest + QUOTA_WINDOW if oldest else None


def quota_gpu_window_frees(*, user, limit_seconds: int) -> datetime | None:
    """When enough of the user's step time of the last QUOTA_WINDOW has left it for their usage to be under
    limit_seconds again (a step may start); None when it is under already."""
    since = timezone.now() - QUOTA_WINDOW
    steps = list(
        Step.objects.filter(run__owner=user, created_at__gte=since)
        .order_by("created_at")
        .values_list("created_at", "duration_s")
    )
    used = sum(seconds for _, seconds in steps)
    if round(used) < limit_seconds:  # rounded as quota_usage counts it
        return None
    for created_at, seconds in steps:
        used -= seconds
        if round(used) < limit_seconds:
            return created_at + QUOTA_WINDOW
    return None


def share_weights(*, user_ids) -> dict[int, tuple[float, str]]:
    """Each user's share weight in the fair queue and where it comes from: their own Quota row's, else the
    largest of their groups' rows' that set one, else 1. Two queries, whatever the number of users."""
    user_ids = set(user_ids)
    rows = Quota.objects.filter(share_weight__isnull=False).order_by()  # (no ordering: no join for it)
    own = dict(rows.filter(user_id__in=user_ids).values_list("user_id", "share_weight"))
    grants: dict[int, tuple[float, str]] = {}
    for user_id, weight, name in rows.filter(group__user__in=user_ids).values_list(
        "group__user", "share_weight", "group__name"
    ):
        if user_id not in grants or weight > grants[user_id][0]:
            grants[user_id] = (weight, f'group "{name}"')
    return {
        user_id: (own[user_id], "your own quota") if user_id in own else grants.get(user_id, (1.0, "the default"))
        for user_id in user_ids
    }
