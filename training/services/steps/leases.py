"""The run's lease: a worker name and a heartbeat. One worker holds a run at a time; a lease whose
holder stopped heartbeating (or died on this host) is free to take."""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from training.models import Run

logger = logging.getLogger(__name__)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def stale_after() -> timedelta:
    return timedelta(seconds=settings.ARTWEB["HEARTBEAT_SECONDS"] * 4)


def run_claim(*, run_id: int, me: str) -> bool:
    """Take the run's lease if it is free, ours, or its holder stopped heartbeating, or is a process of
    this host that no longer exists (a pool child killed mid-step: its step message comes back to another
    child at once, long before the dead one's heartbeat goes stale)."""
    now = timezone.now()
    free = Q(worker="") | Q(worker=me) | Q(heartbeat_at__lt=now - stale_after())
    holder = Run.objects.filter(id=run_id).values_list("worker", flat=True).first()
    if holder and _dead_here(holder):
        free |= Q(worker=holder)
    return Run.objects.filter(free, id=run_id, status__in=Run.ACTIVE_STATUSES).update(worker=me, heartbeat_at=now) == 1


def _dead_here(worker: str) -> bool:
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


def run_release(*, run_id: int, me: str) -> None:
    Run.objects.filter(id=run_id, worker=me).update(worker="")


class Heartbeat:
    """Refreshes the lease from a thread while the step works; exposes cancel/pause flags cheaply."""

    def __init__(self, run_id: int, me: str):
        self.run_id, self.me = run_id, me
        self.interval = settings.ARTWEB["HEARTBEAT_SECONDS"]
        self._stop = threading.Event()
        self.cancel = False
        self.lost = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"heartbeat-run-{run_id}")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)

    def beat(self) -> None:
        try:
            n = Run.objects.filter(id=self.run_id, worker=self.me).update(heartbeat_at=timezone.now())
            self.lost = n == 0
            self.cancel = Run.objects.filter(id=self.run_id, cancel_requested=True).exists()
        finally:
            connection.close()  # this thread's own connection

    def _loop(self):
        while not self._stop.wait(min(self.interval, 2.0)):
            try:
                self.beat()
            except Exception:
                logger.warning("heartbeat failed", exc_info=True)

    def should_stop(self) -> bool:
        return self.cancel or self.lost

    def stop_reason(self) -> str:
        # A lost lease means another worker holds the run now: stop quietly, never cancel it.
        return "cancel" if self.cancel else "lease lost"
