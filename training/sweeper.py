"""The periodic sweep, run inside every Celery worker, so recovery runs wherever the product runs: under
the launcher, in Docker, or with any worker command the README shows. No beat process is needed.

Each worker's main process starts one thread (on Celery's worker_ready signal). Every SWEEP_SECONDS
the thread takes a Redis lock that lets one worker in the whole deployment sweep at a time, and for
every kind of background job its apps registered (training.jobs), the same way:

- recovers the jobs nobody works on: a worker stopped heartbeating, or none took the message; each kind
  says whether it is queued again or failed (training.jobs.services.job_recover_stale);
- sends the messages owed to queued jobs whose dispatch failed (the broker was down when they were
  created, resumed or retried; see artweb.dispatch).
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from artweb.dispatch import publish
from training.jobs.kinds import job_kinds
from training.jobs.services import job_dispatched, job_recover_stale

logger = logging.getLogger(__name__)

LOCK_KEY = "artweb:sweep"
# A row created this recently may still have its message in flight: the sweep leaves it alone.
OWED_AFTER = timedelta(seconds=5)


def dispatch_owed() -> dict[str, list[int]]:
    """Send the messages owed to queued jobs of every kind (dispatched_at null, older than OWED_AFTER):
    the ids sent, by kind."""
    cutoff = timezone.now() - OWED_AFTER
    sent: dict[str, list[int]] = {}
    for kind in job_kinds():
        sent[kind.name] = []
        owed = kind.model.objects.filter(status=kind.owed_status, dispatched_at__isnull=True, created_at__lt=cutoff)
        for job_id in owed.order_by("id").values_list("id", flat=True):
            if publish(kind.task, args=(job_id,)):
                job_dispatched(jobs=kind, job_id=job_id)
                sent[kind.name].append(job_id)
    return sent


def recover_stale() -> dict[str, list[int]]:
    """Recover the stale jobs of every kind: the ids requeued or failed, by kind."""
    return {kind.name: job_recover_stale(jobs=kind) for kind in job_kinds()}


def sweep() -> dict[str, dict[str, list[int]]]:
    return {"recovered": recover_stale(), "sent": dispatch_owed()}


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
                if any(ids for by_kind in done.values() for ids in by_kind.values()):
                    logger.info("sweep: %s", done)
            except Exception:
                logger.warning("sweep failed; trying again in %.0f s", period(), exc_info=True)
            finally:
                close_old_connections()
        connection.close()  # this thread's own; the process goes on without it
