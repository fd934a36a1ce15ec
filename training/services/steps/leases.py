"""The run's lease: a worker name and a heartbeat, a job's lease (training.jobs.leases) taken for each
step. One worker holds a run at a time; a lease whose holder stopped heartbeating (or died on this host)
is free to take."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings

from training.jobs.leases import JobHeartbeat, job_release, worker_name
from training.jobs.services import job_claim
from training.models import Run
from training.services.runs import RUN_JOBS

__all__ = ["Heartbeat", "run_claim", "run_release", "stale_after", "worker_name"]


def stale_after() -> timedelta:
    return RUN_JOBS.lease()


def run_claim(*, run_id: int, me: str) -> bool:
    """Take the run's lease if it is active and the lease is free, ours, or its holder stopped
    heartbeating, or is a process of this host that no longer exists (a pool child killed mid-step: its
    step message comes back to another child at once, long before the dead one's heartbeat goes stale)."""
    return job_claim(jobs=RUN_JOBS, job_id=run_id, me=me)


def run_release(*, run_id: int, me: str) -> None:
    job_release(jobs=RUN_JOBS, job_id=run_id, me=me)


class Heartbeat(JobHeartbeat):
    """Refreshes the lease from a thread while the step works; exposes cancel/pause flags cheaply."""

    def __init__(self, run_id: int, me: str):
        # At most 2 s apart whatever the lease: a cancel reaches the step that quickly.
        super().__init__(RUN_JOBS, run_id, me, every_s=min(settings.ARTWEB["HEARTBEAT_SECONDS"], 2.0))
        self.run_id = run_id
        self.cancel = False

    def checked(self) -> None:
        self.cancel = Run.objects.filter(id=self.run_id, cancel_requested=True).exists()

    def should_stop(self) -> bool:
        return self.cancel or self.lost

    def stop_reason(self) -> str:
        # A lost lease means another worker holds the run now: stop quietly, never cancel it.
        return "cancel" if self.cancel else "lease lost"
