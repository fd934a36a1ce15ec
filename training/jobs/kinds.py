"""Each kind of background job as the machinery knows it: one JobKind per model, declared next to the
service that queues it (training.services.runs.RUN_JOBS, ...) and registered by its app when the app is
ready, so the sweep (training.sweeper) knows every kind without importing the apps that hold them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings

from training import task_names
from training.jobs.models import DONE, FAILED, QUEUED, RUNNING

# What the sweep does with a job whose worker stopped heartbeating.
REQUEUE = "requeue"  # free the lease and send its message again: the task goes on from what the job stored
FAIL = "fail"  # fail it with a message that says so: the work cannot be taken up half-way


@dataclass(frozen=True)
class JobKind:
    """One kind of background job.

    - name: the key the sweep reports it under ("runs", "dry_runs", ...).
    - model: its BackgroundJob model; its timeline is `job.events` (a JobEvent model).
    - task: the Celery task its messages go to; its queue follows from the name (training.task_names).
    - claimable: the statuses a worker may claim it in.
    - claimed_status: the status a claim moves it to; None when a claim only takes the lease (a run's
      step moves the run itself: queued → starting → running).
    - working: the statuses in which a worker holds it and heartbeats; a job in one of them whose
      heartbeat is older than its lease is stale, and the sweep applies `recovery` (REQUEUE or FAIL).
    - finished_status: the status job_finish moves it to.
    - lease_heartbeats: the lease's length in heartbeat periods (ARTWEB["HEARTBEAT_SECONDS"]).
    - requeue_kwargs: the keyword arguments of the message a requeue sends (a run's: the step it owes).
    - requeue_note: the requeue event's message and data (default: which worker stopped).
    - on_event, on_status: called in the transaction that wrote an event row (job, event) or changed the
      status (job, old status): a run's page hears of both (training.services.runs).
    - stale_scope: narrows the stale jobs the sweep may recover (default: every one).
    """

    name: str
    model: type
    task: str
    claimable: tuple[str, ...] = (QUEUED,)
    claimed_status: str | None = RUNNING
    working: tuple[str, ...] = (RUNNING,)
    recovery: str = REQUEUE
    finished_status: str = DONE
    lease_heartbeats: int = 4
    requeue_kwargs: Callable[[object], dict] | None = None
    requeue_note: Callable[[object], tuple[str, dict]] | None = None
    on_event: Callable[[object, object], None] | None = None
    on_status: Callable[[object, str], None] | None = None
    # Narrows the stale jobs the sweep recovers (a QuerySet in, a QuerySet out): a run between steps that waits
    # its turn behind others has no worker and an old heartbeat, yet nothing of it is lost.
    stale_scope: Callable[[object], object] | None = None

    @property
    def queue(self) -> str:
        return task_names.queue(self.task)

    @property
    def open_statuses(self) -> tuple[str, ...]:
        """Every status but the final ones: those a job can still fail from."""
        return tuple(s for s in self.model.Status.values if s not in self.model.FINAL_STATUSES)

    @property
    def failed_status(self) -> str:
        return FAILED

    @property
    def owed_status(self) -> str:
        """A job in this status whose dispatched_at is null is owed its message."""
        return QUEUED

    def lease(self) -> timedelta:
        return timedelta(seconds=settings.ARTWEB["HEARTBEAT_SECONDS"] * self.lease_heartbeats)


_KINDS: dict[str, JobKind] = {}


def job_kind_register(kind: JobKind) -> None:
    """Make a kind known to the sweep; each app registers its kinds in its AppConfig.ready()."""
    _KINDS[kind.name] = kind


def job_kinds() -> tuple[JobKind, ...]:
    return tuple(_KINDS.values())
