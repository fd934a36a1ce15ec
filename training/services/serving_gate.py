"""The worker's serving gate: a run step (and a dry run) holds it from start to end, alone, and a request to
the OpenAI endpoint that is answered on the step's own inference server between steps holds it beside the
other requests. Those are only the requests of a worker whose server holds one policy at a time ("merged"
mode) and that has no second server for the endpoint (ARTWEB_SERVE_THREADS=0, or too little memory for it:
training.services.serving_server); every other request is answered beside the step, on a server it shares
without taking weights from under it, and never waits here.

A step that waits for the gate lets the requests being served finish and holds back new ones: a client
that keeps sending requests never keeps the next step from starting.

It stays in training, which the serving app depends on and never the other way round: the step
(training.services.steps) holds it, and the serving thread, which names a step's adapter as the step does,
takes it."""

from __future__ import annotations

import contextlib
import threading


class ServingGate:
    """A readers-writer lock that prefers its writer: requests share it, a step holds it alone.

    Not reentrant: a step does not take it again inside itself, and a request takes it once."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._requests = 0  # holding it now, shared
        self._step = False  # a step holds it now
        self._steps_waiting = 0

    @contextlib.contextmanager
    def shared(self):
        """One request's hold; it waits while a step holds the gate or waits for it."""
        with self._changed:
            self._changed.wait_for(lambda: not self._step and not self._steps_waiting)
            self._requests += 1
        try:
            yield
        finally:
            with self._changed:
                self._requests -= 1
                if not self._requests:
                    self._changed.notify_all()

    @contextlib.contextmanager
    def exclusive(self):
        """A step's hold: new requests wait from now on, and the step waits for those being served."""
        with self._changed:
            self._steps_waiting += 1
            try:
                self._changed.wait_for(lambda: not self._step and not self._requests)
                self._step = True
            finally:
                self._steps_waiting -= 1
                if not self._step:  # it gave up waiting (interrupted): requests held back for it may go
                    self._changed.notify_all()
        try:
            yield
        finally:
            with self._changed:
                self._step = False
                self._changed.notify_all()

    def wait_open(self, timeout: float) -> bool:
        """Wait up to timeout seconds until no step holds the gate or waits for it; True once none does.
        The serving thread takes no request from the queue before: one taken meanwhile would wait for the
        step's end here, where another worker might have served it."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._step and not self._steps_waiting, timeout)


gate = ServingGate()


@contextlib.contextmanager
def serving_paused():
    """Held by a run step (and a dry run) from start to end: it waits for the requests being served under the
    gate to finish, and those that come meanwhile wait until it is done (requests answered beside the step
    never take the gate)."""
    with gate.exclusive():
        yield


@contextlib.contextmanager
def serving_slot():
    """Held by the serving thread for one request answered on the step's server between steps, beside the
    other requests it serves."""
    with gate.shared():
        yield
