"""The periodic sweep, run inside every Celery worker, so recovery runs wherever the product runs: under
the launcher, in Docker, or with any worker command the README shows. No beat process is needed.

Each worker's main process starts one thread (on Celery's worker_ready signal). Every SWEEP_SECONDS
the thread takes a Redis lock that lets one worker in the whole deployment sweep at a time, and:

- requeues active runs whose worker stopped heartbeating or that no worker holds
  (training.services.steps.runs_requeue_stale);
- sends the messages owed to queued runs, dry runs and re-scores whose dispatch failed (the broker was
  down when they were created, resumed or retried; see artweb.dispatch).
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from artweb.dispatch import publish
from training import task_names
from training.models import DryRun, Rescore, Run
from training.services.rescores import rescore_dispatched
from training.services.runs import run_dispatched
from training.services.steps import runs_requeue_stale

logger = logging.getLogger(__name__)

LOCK_KEY = "artweb:sweep"
# A row created this recently may still have its message in flight: the sweep leaves it alone.
OWED_AFTER = timedelta(seconds=5)


def dispatch_owed() -> dict[str, list[int]]:
    """Send the messages owed to queued runs, dry runs and re-scores (dispatched_at null, older than OWED_AFTER)."""
    cutoff = timezone.now() - OWED_AFTER
    sent: dict[str, list[int]] = {"runs": [], "dry_runs": [], "rescores": []}
    for run_id in Run.objects.filter(
        status=Run.Status.QUEUED, dispatched_at__isnull=True, created_at__lt=cutoff
    ).values_list("id", flat=True):
        if publish(task_names.RUN_STEP, args=(run_id,)):
            run_dispatched(run_id)
            sent["runs"].append(run_id)
    for dry_id in DryRun.objects.filter(
        status=DryRun.Status.QUEUED, dispatched_at__isnull=True, created_at__lt=cutoff
    ).values_list("id", flat=True):
        if publish(task_names.DRY_RUN, args=(dry_id,)):
            DryRun.objects.filter(id=dry_id).update(dispatched_at=timezone.now())
            sent["dry_runs"].append(dry_id)
    for rescore_id in Rescore.objects.filter(
        status=Rescore.Status.QUEUED, dispatched_at__isnull=True, created_at__lt=cutoff
    ).values_list("id", flat=True):
        if publish(task_names.RESCORE_EXECUTE, args=(rescore_id,)):
            rescore_dispatched(rescore_id)
            sent["rescores"].append(rescore_id)
    return sent


def sweep() -> dict[str, list[int]]:
    return {"requeued": runs_requeue_stale(), **dispatch_owed()}


def period() -> float:
    return float(settings.ARTWEB["SWEEP_SECONDS"])


class Sweeper:
    """The thread; start() once per worker process."""

    _started = False
    _lock = threading.Lock()

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="artweb-sweeper", daemon=True)

    @classmethod
    def start(cls) -> Sweeper | None:
        with cls._lock:
            if cls._started or period() <= 0:
                return None
            cls._started = True
        sweeper = cls()
        sweeper._thread.start()
        return sweeper

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        import redis

        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5)
        while not self._stop.wait(period()):
            try:
                # Held a little less than a period: one sweep per period in the whole deployment.
                if not client.set(LOCK_KEY, "1", nx=True, px=int(period() * 900)):
                    continue
                close_old_connections()
                done = sweep()
                if any(done.values()):
                    logger.info("sweep: %s", done)
            except Exception:
                logger.warning("sweep failed; trying again in %.0f s", period(), exc_info=True)
            finally:
                close_old_connections()
        connection.close()  # this thread's own; the process goes on without it
