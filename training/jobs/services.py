"""The state machine of every background job (runs, dry runs, re-scores, serve jobs).

Every change is a conditional UPDATE with a row count plus an event row, in one transaction, so a
duplicate Celery delivery or a double click changes nothing the second time; messages leave only after
the commit (artweb.dispatch). A run's status changes go through run_transition, this module's
job_transition with the run's page told (training.services.runs).
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from artweb.dispatch import publish_on_commit
from training.jobs.kinds import FAIL, JobKind
from training.jobs.leases import dead_here
from training.jobs.models import RUNNING

ERROR_CHARS = 5000


def job_event(
    *, jobs: JobKind, job, kind: str, message: str = "", data: dict | None = None, actor=None, worker: str = ""
):
    """Write one row of the job's timeline."""
    event = job.events.create(kind=kind, message=message, data=data or {}, actor=actor, worker=worker)
    if jobs.on_event is not None:
        jobs.on_event(job, event)
    return event


@transaction.atomic
def job_transition(
    *,
    jobs: JobKind,
    job,
    from_statuses,
    to_status: str,
    message: str = "",
    actor=None,
    where: Q | None = None,
    by_worker: str | None = None,
    **fields,
) -> bool:
    """Move the job to to_status if it is in one of from_statuses (and matches `where`). Returns False
    (and writes nothing) if another actor got there first. The status and its event are committed
    together: nobody reads one without the other. `fields` are set in the same UPDATE; the event names
    by_worker, or else the worker that held the job."""
    if isinstance(from_statuses, str):
        from_statuses = (from_statuses,)
    now = timezone.now()
    if to_status == RUNNING:
        fields.setdefault("started_at", job.started_at or now)
    if to_status in jobs.model.FINAL_STATUSES:
        fields.setdefault("finished_at", now)
    rows = jobs.model.objects.filter(id=job.id, status__in=from_statuses)
    if where is not None:
        rows = rows.filter(where)
    if rows.update(status=to_status, **fields) != 1:
        return False
    old, holder = job.status, job.worker
    job.refresh_from_db()
    job_event(
        jobs=jobs,
        job=job,
        kind="status",
        message=message or f"{old} → {to_status}",
        data={"from": old, "to": to_status},
        actor=actor,
        worker=holder if by_worker is None else by_worker,
    )
    if jobs.on_status is not None:
        jobs.on_status(job, old)
    return True


@transaction.atomic
def job_claim(*, jobs: JobKind, job_id: int, me: str) -> bool:
    """Take the job for worker `me`: True if we got it.

    A conditional UPDATE: the job is in one of its kind's claimable statuses and its lease is free (no
    holder, ours, its holder's heartbeat older than the lease, or its holder a process of this host that
    has exited: a pool child killed mid-task, whose message comes back to another child long before its
    heartbeat goes stale). A claim that moves the job (queued → running) writes its event."""
    now = timezone.now()
    job = jobs.model.objects.select_for_update().filter(id=job_id).only("status", "worker", "started_at").first()
    if job is None:
        return False
    free = Q(worker="") | Q(worker=me) | Q(heartbeat_at__lt=now - jobs.lease())
    if job.worker and dead_here(job.worker):
        free |= Q(worker=job.worker)
    lease = {"worker": me, "heartbeat_at": now}
    if jobs.claimed_status is None or job.status == jobs.claimed_status:
        return jobs.model.objects.filter(free, id=job_id, status__in=jobs.claimable).update(**lease) == 1
    return job_transition(
        jobs=jobs,
        job=job,
        from_statuses=jobs.claimable,
        to_status=jobs.claimed_status,
        where=free,
        by_worker=me,
        message=f"Worker {me} took it.",
        **lease,
    )


def job_finish(*, jobs: JobKind, job, message: str = "", **fields) -> bool:
    """The worker's work is done: working → its finished status, the lease given up."""
    return job_transition(
        jobs=jobs,
        job=job,
        from_statuses=jobs.working,
        to_status=jobs.finished_status,
        message=message or "Done.",
        worker="",
        **fields,
    )


def job_fail(*, jobs: JobKind, job, error: str, message: str = "", where: Q | None = None, **fields) -> bool:
    """Fail the job from any status but a final one, with the error a person reads; the lease given up."""
    return job_transition(
        jobs=jobs,
        job=job,
        from_statuses=jobs.open_statuses,
        to_status=jobs.failed_status,
        message=message or f"Failed: {error[:500]}",
        where=where,
        error=error[:ERROR_CHARS],
        worker="",
        **fields,
    )


def job_dispatched(*, jobs: JobKind, job_id: int) -> None:
    """The broker took the job's message: nothing is owed."""
    jobs.model.objects.filter(id=job_id).update(dispatched_at=timezone.now())


def job_enqueue(*, jobs: JobKind, job) -> None:
    """Owe the job its message and send it after commit. When the broker cannot take it, the job stays
    queued with its message owed (dispatched_at null), and the sweep sends it later (training.sweeper)."""
    if job.dispatched_at is not None:  # sent before (a resumed or retried run): owed again
        jobs.model.objects.filter(id=job.id).update(dispatched_at=None)
        job.dispatched_at = None
    publish_on_commit(jobs.task, args=(job.id,), sent=lambda: job_dispatched(jobs=jobs, job_id=job.id))


def job_recover_stale(*, jobs: JobKind) -> list[int]:
    """Recover the jobs of this kind that nobody works on: in a working status, their heartbeat older
    than the lease (the worker was killed or lost its host; or, holding none, no worker took the message
    sent for it). Each is requeued or failed, as its kind says; returns their ids."""
    now = timezone.now()
    cutoff = now - jobs.lease()
    stale = jobs.model.objects.filter(status__in=jobs.working, heartbeat_at__lt=cutoff)
    if jobs.stale_scope is not None:
        stale = jobs.stale_scope(stale)
    return [job.id for job in stale if _recover(jobs, job, cutoff=cutoff, now=now)]


@transaction.atomic
def _recover(jobs: JobKind, job, *, cutoff, now) -> bool:
    # Only as the sweep found it: a worker that heartbeated or took it meanwhile keeps it.
    unchanged = Q(worker=job.worker, heartbeat_at__lt=cutoff)
    if jobs.recovery == FAIL:
        gone = f"Its worker {job.worker} stopped heartbeating" if job.worker else "No worker held it"
        return job_fail(jobs=jobs, job=job, where=unchanged, error=f"{gone}, so it was stopped; start it again.")
    rows = jobs.model.objects.filter(unchanged, id=job.id, status__in=jobs.working)
    # The requeue counts as activity: the next sweep leaves it alone for another lease.
    if rows.update(worker="", heartbeat_at=now) != 1:
        return False
    if jobs.requeue_note is not None:
        message, data = jobs.requeue_note(job)
    elif job.worker:
        message, data = f"Worker {job.worker} stopped heartbeating; queued it again.", {"worker": job.worker}
    else:
        message, data = "No worker took it; queued it again.", {"worker": ""}
    job_event(jobs=jobs, job=job, kind="requeued", message=message, data=data, worker=job.worker)
    kwargs = jobs.requeue_kwargs(job) if jobs.requeue_kwargs is not None else None
    publish_on_commit(jobs.task, args=(job.id,), kwargs=kwargs)
    return True
