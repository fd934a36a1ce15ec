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
# Each worker's sweeper thread marks its worker alive under this prefix every period, idle or busy; the
# mark outlives four periods (training.prometheus counts the marks).
ALIVE_PREFIX = "artweb:worker:"
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


def worker_mark(client, name: str, queue: str) -> None:
    """Mark a worker alive for four sweep periods; its value is the queue it serves ("gpu" or "default")."""
    client.set(f"{ALIVE_PREFIX}{name}", queue, ex=max(1, round(period() * 4)))


def workers_alive(client) -> dict[str, int]:
    """Workers whose sweeper marked them alive within four periods, counted by queue."""
    counts: dict[str, int] = {}
    names = list(client.scan_iter(match=f"{ALIVE_PREFIX}*", count=500))
    for queue in client.mget(names) if names else []:
        if queue is not None:
            key = queue.decode() if isinstance(queue, bytes) else str(queue)
            counts[key] = counts.get(key, 0) + 1
    return counts


class Sweeper:
    """The thread; start() once per worker process."""

    _started = False
    _lock = threading.Lock()

    def __init__(self, name: str = "", queue: str = "default") -> None:
        self._stop = threading.Event()
        self._name, self._queue = name, queue
        self._thread = threading.Thread(target=self._loop, name="artweb-sweeper", daemon=True)

    @classmethod
    def start(cls, name: str = "", queue: str = "default") -> Sweeper | None:
        """name: the worker's (its Celery hostname), marked alive every period; queue: the one it serves."""
        with cls._lock:
            if cls._started or period() <= 0:
                return None
            cls._started = True
        sweeper = cls(name, queue)
        sweeper._thread.start()
        return sweeper

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        import redis

        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5)
        self._mark(client)
        while not self._stop.wait(period()):
            self._mark(client)
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

    def _mark(self, client) -> None:
        if not self._name:
            return
        try:
            worker_mark(client, self._name, self._queue)
        except Exception:  # Redis away: the mark lapses and the metric says so
            logger.warning("could not mark worker %s alive", self._name, exc_info=True)
