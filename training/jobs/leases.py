"""A job's lease: the name of the worker that holds it and its heartbeat. One worker holds a job at a time;
a lease whose holder stopped heartbeating (or died on this host) is free to take (training.jobs.services)."""

from __future__ import annotations

import logging
import os
import socket
import threading

from django.conf import settings
from django.db import connection
from django.utils import timezone

from training.jobs.kinds import JobKind

logger = logging.getLogger(__name__)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def dead_here(worker: str) -> bool:
    """The worker name is a process of this host that has exited."""
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


def job_heartbeat(*, jobs: JobKind, job_id: int, me: str) -> bool:
    """Say the job's holder is alive; False when `me` no longer holds it."""
    return jobs.model.objects.filter(id=job_id, worker=me).update(heartbeat_at=timezone.now()) == 1


def job_release(*, jobs: JobKind, job_id: int, me: str) -> None:
    """Give the lease up (a run between two steps); the status stays."""
    jobs.model.objects.filter(id=job_id, worker=me).update(worker="")


class JobHeartbeat:
    """Keeps the job's lease from a thread while the work goes on: `with JobHeartbeat(KIND, job.id, me):`.

    `lost` turns true when another worker holds the job now (it took the lease as stale, or the sweep
    freed it). A kind that checks more on each beat overrides checked()."""

    def __init__(self, jobs: JobKind, job_id: int, me: str, *, every_s: float | None = None):
        self.jobs, self.job_id, self.me = jobs, job_id, me
        self.every_s = every_s if every_s is not None else float(settings.ARTWEB["HEARTBEAT_SECONDS"])
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"heartbeat-{jobs.name}-{job_id}")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)

    def beat(self) -> None:
        try:
            self.lost = not job_heartbeat(jobs=self.jobs, job_id=self.job_id, me=self.me)
            self.checked()
        finally:
            connection.close()  # this thread's own connection

    def checked(self) -> None:
        """Runs after each beat, in the heartbeat's thread."""

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.beat()
            except Exception:
                logger.warning("heartbeat of %s %s failed", self.jobs.name, self.job_id, exc_info=True)
