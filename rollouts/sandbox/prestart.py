"""Batches started in two halves, and the ones a worker starts ahead of their batch.

A sandbox process spends about a CPU-second before it can run anything: the interpreter, the SDK and the
OpenAI client's import (pydantic models by the hundred; the .pyc files are already compiled, so a
compiled-module cache would save nothing: the time is the modules' own code running). The jail itself
costs tens of milliseconds. So every batch's processes are started in two halves: first the jail and
the interpreter, which imports all that and waits on a pipe; then the hand-over, which writes the batch's
files into its (already bound) directories, opens its proxy socket and sends the go with the batch's
environment. A batch started cold does both at once (and imports only what its code imports). A run's
step pre-starts the first half for its next batch once its update is done (prestart_batch), while the
checkpoint is written and the inference server loads the new policy, which leave a core idle, at the
lowest CPU priority; the hand-over restores normal priority before any user code is loaded. Not during
the update: the batch's cgroup competes with the worker as a whole, whatever its processes' priority,
and imports running beside an update on 2 cores made it 15-25 % slower.

Isolation is that of a cold batch: a pre-started batch is a jail of its own (work root, uid, cgroup, pid,
mount and network namespaces, scratch) built after the previous batch's jail was torn down, holds no user
code or data until its hand-over (but its run's read-only data attachments, part of the batch's shape), is
handed to exactly one batch of the key (the run) it was started for, and is closed with that batch like any
other. One that no batch takes (another shape, another worker
took the run, the run ended) is killed and removed, at the latest after PRESTART_MAX_AGE_S.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rollouts.sandbox.batch import BatchFiles, BatchShape
from rollouts.sandbox.jail import Jail
from rollouts.sandbox.mounts import FALLBACKS_DIR, GUEST_DIR
from rollouts.sandbox.process import Sandbox
from rollouts.sandbox.records import ResultBudget

if TYPE_CHECKING:
    from rollouts.sandbox.rollouts import RolloutRequest
    from rollouts.sandbox.scores import ScoreRequest

logger = logging.getLogger(__name__)

PRESTART_MAX_AGE_S = 900.0  # an unused pre-started batch is discarded after this long
PRESTART_CAPACITY = 2  # pre-started batches one worker process holds at most (a GPU worker runs one run)


class StartedBatch:
    """A batch's work root, jail and waiting sandbox processes. Handed over to one batch, then closed."""

    def __init__(self, shape: BatchShape, layout: BatchFiles) -> None:
        self.shape = shape
        self.layout = layout
        self.jail: Jail | None = None
        self.boxes: list[Sandbox] = []
        self.started_at = time.monotonic()
        self.expiry: threading.Timer | None = None
        self._closed = False

    @classmethod
    def start(
        cls, shape: BatchShape, *, prefix: str, box_type: type[Sandbox] | None = None, ahead: bool = False
    ) -> StartedBatch:
        """Raises JailUnavailable (before any process starts) when the jail cannot be built here."""
        batch = cls(shape, BatchFiles(Path(tempfile.mkdtemp(prefix=prefix)), shape.sandboxes))
        try:
            if shape.jail.jailed:
                batch.jail = Jail(
                    config=shape.jail,
                    root=batch.layout.root,
                    socket_dir=batch.layout.root / "sock",
                    guest_dir=GUEST_DIR,
                    fallbacks_dir=FALLBACKS_DIR,
                    python=shape.python,
                    limits=shape.jail_limits(),
                    files=shape.attachment_files(),
                )
                batch.layout.hand_over(batch.jail.uid)
            else:
                batch.layout.link_attachments(shape.attachments)
            for k in range(shape.sandboxes):
                batch.boxes.append((box_type or Sandbox).start(shape, batch.layout, k, batch.jail, ahead=ahead))
        except BaseException:
            batch.close()
            raise
        return batch

    def alive(self) -> bool:
        return not self._closed and all(box.proc.poll() is None for box in self.boxes)

    def hand_over(self, request: RolloutRequest | ScoreRequest) -> None:
        """The batch's files are written: hand them to the sandbox uid, restore normal CPU priority, and let
        each process run its groups."""
        if self.jail is not None:
            self.layout.hand_over(self.jail.uid)
            self.jail.renice(0)
        n = len(self.boxes)
        budget = ResultBudget(request.limits.batch_bytes)  # one for the batch, whichever process sends
        for k, box in enumerate(self.boxes):
            box.budget = budget
            box.begin(request, list(range(k, len(request.scenarios), n)), self.layout)

    def close(self) -> None:
        """Kill every process, remove the cgroup and every file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.expiry is not None:
            self.expiry.cancel()
        if self.jail is not None:
            self.jail.renice()  # a pre-started batch is of the idle class: killed so, it could take seconds to exit
        for box in self.boxes:
            box.cleanup()
        if self.jail is not None:
            self.jail.close()
        shutil.rmtree(self.layout.root, ignore_errors=True)


class PrestartedBatches:
    """The batches this process started ahead, at most one per key and `capacity` in all.

    add() starts the processes from the calling thread, add_soon() from this process's pre-starting thread,
    which lives as long as the process: the parent-death signal bwrap's --die-with-parent asks for is tied
    by the kernel to the thread that forked (prctl(2)), and a thread that never ends cannot fire it early.
    """

    def __init__(self, capacity: int = PRESTART_CAPACITY, max_age_s: float = PRESTART_MAX_AGE_S) -> None:
        self.capacity = capacity
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._by_key: dict[str, StartedBatch] = {}
        self._pending: dict[str, threading.Event] = {}  # keys whose add_soon() has not finished
        self._jobs: queue.SimpleQueue | None = None
        self._starter_pid: int | None = None  # the process the pre-starting thread runs in

    def add_soon(self, key: str, shape: BatchShape) -> None:
        """add() on the pre-starting thread; returns at once (the fork and the jail's set-up, 0.1-0.2 s, are
        then off the caller's path). take() and discard() of the key wait for it."""
        done = threading.Event()
        with self._lock:
            if self._starter_pid != os.getpid():  # none yet, or a fork of the process that had it
                self._jobs = queue.SimpleQueue()
                threading.Thread(
                    target=self._start_loop, args=(self._jobs,), name="sandbox-prestart", daemon=True
                ).start()
                self._starter_pid = os.getpid()
            self._pending[key] = done
            self._jobs.put((key, shape, done))

    def _start_loop(self, jobs: queue.SimpleQueue) -> None:
        while True:
            key, shape, done = jobs.get()
            try:
                self.add(key, shape)
            finally:
                with self._lock:
                    if self._pending.get(key) is done:
                        del self._pending[key]
                done.set()

    def _wait_pending(self, key: str | None, timeout_s: float = 60.0) -> None:
        with self._lock:
            waiting = [done for k, done in self._pending.items() if key is None or k == key]
        for done in waiting:
            if not done.wait(timeout_s):
                logger.warning("the sandbox batch pre-started for %s took over %.0f s", key, timeout_s)

    def add(self, key: str, shape: BatchShape) -> None:
        """Pre-start a batch of `shape` for the key's next batch. A failure is logged, never raised: that
        batch then starts cold."""
        self._close(key)  # not discard(): add_soon() runs this while the key is pending
        try:
            batch = StartedBatch.start(shape, prefix="artweb-batch-", ahead=True)
        except Exception:
            logger.warning("could not pre-start the next sandbox batch of %s", key, exc_info=True)
            return
        batch.expiry = threading.Timer(self.max_age_s, self._expire, args=(key, batch))
        batch.expiry.daemon = True
        batch.expiry.start()
        with self._lock:
            self._by_key[key] = batch
            oldest = sorted(self._by_key.items(), key=lambda item: item[1].started_at)
            dropped = [self._by_key.pop(k) for k, _ in oldest[: max(0, len(oldest) - self.capacity)]]
        for old in dropped:
            old.close()

    def take(self, key: str, shape: BatchShape) -> StartedBatch | None:
        """The batch pre-started for `key`, if it has this shape and is still whole; it leaves the pool
        either way, so it is never offered twice."""
        self._wait_pending(key)
        with self._lock:
            batch = self._by_key.pop(key, None)
        if batch is None:
            return None
        if batch.shape == shape and batch.alive() and time.monotonic() - batch.started_at < self.max_age_s:
            if batch.expiry is not None:
                batch.expiry.cancel()
            return batch
        batch.close()
        return None

    def keys(self) -> list[str]:
        """The keys that hold a pre-started batch, once the add_soon() calls in progress are done."""
        self._wait_pending(None)
        with self._lock:
            return list(self._by_key)

    def discard(self, key: str | None = None) -> None:
        """Close the batch pre-started for `key` (None: all of them), once any add_soon() of it is done."""
        self._wait_pending(key)
        self._close(key)

    def _close(self, key: str | None) -> None:
        with self._lock:
            batches = [self._by_key.pop(k) for k in list(self._by_key) if key is None or k == key]
        for batch in batches:
            batch.close()

    def _expire(self, key: str, batch: StartedBatch) -> None:
        with self._lock:
            if self._by_key.get(key) is not batch:
                return
            del self._by_key[key]
        batch.close()


prestarted = PrestartedBatches()
atexit.register(prestarted.discard)
