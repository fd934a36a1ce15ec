"""The fair queue of training steps, read: which runs wait for a GPU worker, in the order their turns come,
and why each waits (docs: Scheduling).

A run waits for a turn when it is active (queued, starting or running: the statuses a step claims it in,
RUN_JOBS.claimable) and no worker holds its lease. waiting_runs() orders them: first the runs of the owner
with the least *weighted recent GPU time* (the seconds of the owner's steps recorded in the last
ARTWEB_FAIR_SHARE_HOURS, divided by the owner's share weight), then, at equal weighted time, the run that
has waited longest (since its last step was recorded, or since it was queued). The GPU worker that takes a
step message claims the first of them it can (training.services.steps.fair); run_queue_places() tells
each run its place in that same order, so the two never disagree.

Paused runs, runs waiting for their ART client and finished ones are not in the queue; nor is a run a
worker holds (it is training its step).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.db.models import OuterRef, Q, Subquery, Sum
from django.utils import timezone

from training.models import Run, Step
from training.selectors_quotas import share_weights
from training.sweeper import workers_alive

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WaitingRun:
    """A run waiting for a GPU turn, with what orders it."""

    run_id: int
    owner_id: int
    steps_done: int
    gpu_seconds: float  # the owner's step seconds in the fair-share window
    weight: float  # the owner's share weight
    waiting_since: datetime  # when its last step was recorded, or it was queued

    @property
    def weighted(self) -> float:
        """What the queue compares owners by: recent GPU seconds per unit of share."""
        return self.gpu_seconds / self.weight


@dataclass(frozen=True)
class QueuePlace:
    """A waiting run's place: 1 is next; `ahead` runs go before it; `reason` is one line a person reads."""

    place: int
    ahead: int
    reason: str


def fair_share_window() -> timedelta:
    return timedelta(hours=settings.ARTWEB_FAIR_SHARE_HOURS)


def waiting_runs(*, prefer: int | None = None) -> list[WaitingRun]:
    """Every run waiting for a GPU turn, in the order a turn tries them: least weighted recent GPU time of
    the owner first; at equal weighted time the run `prefer` (the step message's own run: it may also be
    held by a worker that died, whose lease its claim takes over), then the one waiting longest, then the
    oldest. Four queries, whatever the number of runs."""
    since = timezone.now() - fair_share_window()
    last_step = Step.objects.filter(run=OuterRef("pk")).order_by("-step").values("created_at")[:1]
    free = Q(worker="") | Q(id=prefer) if prefer is not None else Q(worker="")
    rows = list(
        Run.objects.filter(free, status__in=Run.ACTIVE_STATUSES)  # = RUN_JOBS.claimable
        .annotate(last_step_at=Subquery(last_step))
        .values("id", "owner_id", "steps_done", "created_at", "dispatched_at", "last_step_at")
    )
    if not rows:
        return []
    owners = {row["owner_id"] for row in rows}
    # Steps of runs that ended before the window are not in it: only the others' are looked at.
    recent = Run.objects.filter(Q(finished_at__isnull=True) | Q(finished_at__gte=since), owner_id__in=owners)
    seconds = dict(
        Step.objects.filter(run__in=recent.values("id"), created_at__gte=since)
        .values("run__owner_id")
        .annotate(total=Sum("duration_s"))
        .values_list("run__owner_id", "total")
    )
    weights = share_weights(user_ids=owners)
    waiting = [
        WaitingRun(
            run_id=row["id"],
            owner_id=row["owner_id"],
            steps_done=row["steps_done"],
            gpu_seconds=float(seconds.get(row["owner_id"]) or 0.0),
            weight=weights[row["owner_id"]][0],
            # Queued anew (resumed, retried) after its last step: waiting since then.
            waiting_since=max(t for t in (row["created_at"], row["dispatched_at"], row["last_step_at"]) if t),
        )
        for row in rows
    ]
    return sorted(waiting, key=lambda w: (w.weighted, w.run_id != prefer, w.waiting_since, w.run_id))


def gpu_workers_alive() -> int | None:
    """GPU workers whose sweeper marked them alive lately (training.sweeper); None when Redis cannot say."""
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        try:
            return workers_alive(client).get("gpu", 0)
        finally:
            client.close()
    except Exception:  # Redis away: the queue's reasons leave the workers out
        logger.warning("worker marks unavailable", exc_info=True)
        return None


def run_queue_places() -> dict[int, QueuePlace]:
    """Each waiting run's place in the fair queue, by run id: its place (1 = next), how many runs go before
    it and a one-line reason, e.g. "2nd in line: 1 run of a user with less GPU time in the last hour goes
    first" or "next: waiting for a GPU worker to finish run #12's step". A run that is not waiting (held by
    a worker, paused, waiting for its client, finished) has no entry.

    The order is waiting_runs()'s, the one the GPU workers' pick follows. Five queries and one Redis scan,
    whatever the number of runs: one call serves a whole page of runs."""
    waiting = waiting_runs()
    if not waiting:
        return {}
    training = list(
        Run.objects.filter(status__in=Run.ACTIVE_STATUSES)
        .exclude(worker="")
        .order_by("id")
        .values_list("id", flat=True)
    )
    workers = gpu_workers_alive()
    free = 0 if workers is None else max(workers - len(training), 0)
    places = {}
    for index, run in enumerate(waiting):
        if workers == 0:
            reason = f"{_head(index)}; no GPU worker is running"
        elif index < free:
            reason = f"{_head(index)}: a GPU worker is free to take it now"
        elif index == 0:
            reason = "next: " + _busy(training)
        else:
            reason = f"{_head(index)}: {_ahead(waiting[:index], run)}"
        places[run.run_id] = QueuePlace(place=index + 1, ahead=index, reason=reason)
    return places


def run_queue_place(*, run: Run) -> QueuePlace | None:
    """One run's place (run_queue_places), or None when it is not waiting; a run that is not waiting costs
    no query."""
    if run.status not in Run.ACTIVE_STATUSES or run.worker:
        return None
    return run_queue_places().get(run.id)


def _head(index: int) -> str:
    return "next" if index == 0 else f"{_ordinal(index + 1)} in line"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _busy(training: list[int]) -> str:
    if not training:
        return "waiting for a GPU worker to take it"
    if len(training) == 1:
        return f"waiting for a GPU worker to finish run #{training[0]}'s step"
    names = ", ".join(f"#{run_id}" for run_id in training[:-1]) + f" or #{training[-1]}"
    return f"waiting for a GPU worker to finish a step of run {names}"


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _ahead(before: list[WaitingRun], run: WaitingRun) -> str:
    """Why the runs before this one go first, grouped by the rule that puts each there."""
    share = " for their share" if any(w.weight != 1 for w in (*before, run)) else ""
    less = [w for w in before if w.owner_id != run.owner_id and w.weighted < run.weighted]
    tied = [w for w in before if w.owner_id != run.owner_id and w.weighted == run.weighted]
    mine = len(before) - len(less) - len(tied)  # the same user's, waiting longer
    parts = []
    if less:
        parts.append(f"{_runs(len(less))} of {_users(less)} with less GPU time{share} in {_window_text()}")
    if tied:
        parts.append(f"{_runs(len(tied))} of {_users(tied)} with as much GPU time{share} but waiting longer")
    if mine:
        parts.append(f"{_runs(mine)} of the same user waiting longer")
    return " and ".join(parts) + (" goes first" if len(before) == 1 else " go first")


def _users(runs: list[WaitingRun]) -> str:
    return "a user" if len({w.owner_id for w in runs}) == 1 else "users"


def _window_text() -> str:
    hours = settings.ARTWEB_FAIR_SHARE_HOURS
    if hours == 1:
        return "the last hour"
    if hours < 1:
        return f"the last {round(hours * 60)} minutes"
    return f"the last {hours:g} hours"
