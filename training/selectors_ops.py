"""What operators read about the GPU workers' sharing: who used how much GPU time, the fair queue and how long
its runs wait, and which runs each worker trains and holds (the admin's Scheduling page and /metrics).

GPU time is the wall time of training steps, as the fair queue and the GPU-hours quota count it: a step
holds its worker and its GPU from start to end.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db.models import Count, Q, Sum
from django.utils import timezone

from training.models import Run, Step
from training.selectors_queue import fair_share_window, gpu_workers_alive, run_queue_places, waiting_runs
from training.selectors_quotas import share_weights
from training.services.trainer_pool import HELD_KEY, HELD_TTL_S

DAY = timedelta(hours=24)
WAITS_WINDOW = timedelta(hours=1)  # the steps whose waits the page and the metrics sum up


@dataclass(frozen=True)
class UserUsage:
    user_id: int
    username: str
    window_seconds: float  # step seconds in the fair-share window
    day_seconds: float  # step seconds in the last 24 hours
    weight: float
    active_runs: int

    @property
    def day_hours(self) -> float:
        return self.day_seconds / 3600


@dataclass(frozen=True)
class QueuedRun:
    run_id: int
    name: str
    owner: str
    place: int
    reason: str
    waiting_s: float


@dataclass(frozen=True)
class WorkerLoad:
    worker: str
    training: int | None  # the run whose step it trains now
    held: list[int]  # the runs whose training state it keeps (training.services.trainer_pool)
    published_s_ago: float | None


@dataclass(frozen=True)
class Waits:
    """How long the steps recorded in the last WAITS_WINDOW waited for their turn."""

    steps: int
    mean_s: float | None
    max_s: float | None


def usage_by_user() -> list[UserUsage]:
    """Every user with a step in the last 24 hours or a run queued or running, most GPU time first."""
    now = timezone.now()
    since_window, since_day = now - fair_share_window(), now - DAY
    users = (
        get_user_model()
        .objects.annotate(
            day=Sum("runs__steps__duration_s", filter=Q(runs__steps__created_at__gte=since_day)),
            window=Sum("runs__steps__duration_s", filter=Q(runs__steps__created_at__gte=since_window)),
        )
        .filter(Q(day__gt=0) | Q(runs__status__in=Run.ACTIVE_STATUSES))
        .distinct()
        .values("id", "username", "day", "window")
    )
    rows = list(users)
    active = dict(
        Run.objects.filter(owner_id__in=[r["id"] for r in rows], status__in=Run.ACTIVE_STATUSES)
        .values("owner_id")
        .annotate(n=Count("id"))
        .values_list("owner_id", "n")
    )
    weights = share_weights(user_ids={r["id"] for r in rows}) if rows else {}
    usage = [
        UserUsage(
            user_id=r["id"],
            username=r["username"],
            window_seconds=float(r["window"] or 0.0),
            day_seconds=float(r["day"] or 0.0),
            weight=weights[r["id"]][0],
            active_runs=active.get(r["id"], 0),
        )
        for r in rows
    ]
    return sorted(usage, key=lambda u: (-u.day_seconds, u.username))


def queue_overview() -> list[QueuedRun]:
    """The waiting runs in the order their turns come, with their reasons and how long each has waited."""
    places = run_queue_places()
    if not places:
        return []
    since = {w.run_id: w.waiting_since for w in waiting_runs()}
    runs = {r.id: r for r in Run.objects.filter(id__in=places).select_related("owner")}
    now = timezone.now()
    queued = [
        QueuedRun(
            run_id=run_id,
            name=runs[run_id].name,
            owner=runs[run_id].owner.get_username(),
            place=place.place,
            reason=place.reason,
            waiting_s=(now - since[run_id]).total_seconds() if run_id in since else 0.0,
        )
        for run_id, place in places.items()
        if run_id in runs
    ]
    return sorted(queued, key=lambda q: q.place)


def worker_loads() -> list[WorkerLoad]:
    """Each GPU worker that trains a step now or published the runs it holds within the last hour."""
    published = cache.get(HELD_KEY) or {}
    now = time.time()
    training = dict(Run.objects.filter(status__in=Run.ACTIVE_STATUSES).exclude(worker="").values_list("worker", "id"))
    names = set(training) | {n for n, seen in published.items() if now - seen.get("at", 0) < HELD_TTL_S}
    return [
        WorkerLoad(
            worker=name,
            training=training.get(name),
            held=list(published.get(name, {}).get("runs", [])),
            published_s_ago=now - published[name]["at"] if name in published else None,
        )
        for name in sorted(names)
    ]


def step_waits() -> Waits:
    """The waits of the steps recorded in the last WAITS_WINDOW: from the run's previous step's record (or its
    creation, for a first step) to the step's start (its record less its duration). A paused run's pause
    counts as waiting: read the maximum with that in mind."""
    since = timezone.now() - WAITS_WINDOW
    recent = list(
        Step.objects.filter(created_at__gte=since).values(
            "run_id", "step", "created_at", "duration_s", "run__created_at"
        )
    )
    if not recent:
        return Waits(steps=0, mean_s=None, max_s=None)
    previous = {
        (row["run_id"], row["step"]): row["created_at"]
        for row in Step.objects.filter(
            Q(*[Q(run_id=r["run_id"], step=r["step"] - 1) for r in recent], _connector=Q.OR)
        ).values("run_id", "step", "created_at")
    }
    waits = []
    for row in recent:
        ready: datetime = previous.get((row["run_id"], row["step"] - 1), row["run__created_at"])
        started = row["created_at"] - timedelta(seconds=row["duration_s"] or 0.0)
        waits.append(max((started - ready).total_seconds(), 0.0))
    return Waits(steps=len(waits), mean_s=statistics.fmean(waits), max_s=max(waits))


def scheduling_overview() -> dict:
    """Everything the admin's Scheduling page shows."""
    queue = queue_overview()
    return {
        "users": usage_by_user(),
        "queue": queue,
        "workers": worker_loads(),
        "gpu_workers_alive": gpu_workers_alive(),
        "waits": step_waits(),
        "oldest_wait_s": max((q.waiting_s for q in queue), default=None),
        "window_hours": fair_share_window().total_seconds() / 3600,
    }
