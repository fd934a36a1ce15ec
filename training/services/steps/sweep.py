"""The stale sweep of runs: active runs nobody is working on are queued again (training.sweeper calls it
for every kind of job; this is the runs' share)."""

from __future__ import annotations

from training.jobs.services import job_recover_stale
from training.services.runs import RUN_JOBS


def runs_requeue_stale() -> list[int]:
    """Requeue active runs that nobody is working on.

    Two cases: the run's worker stopped heartbeating (killed, lost its host), or no worker holds the run
    and none has for stale_after() (a worker died between releasing one step and claiming the next, and
    the next step's message waits unacknowledged until the broker's visibility timeout). A duplicate step
    message is harmless: the step task is idempotent.
    """
    return job_recover_stale(jobs=RUN_JOBS)
