"""The worker's serving gate (training.services.serving_gate) with real threads: requests share it, a step
holds it alone, and a step that waits holds back new requests while those being served finish.

Each holder is a thread that says through an Event when it holds the gate and lets go when told. A
holder that must wait is shown waiting by not saying so within BLOCKED_S, and then shown to get in once
what held it back is gone: the waits are the assertion, never what orders the threads."""

from __future__ import annotations

import threading

import pytest

from training.services.serving_gate import ServingGate

BLOCKED_S = 0.2  # how long a thread that should wait is given to (wrongly) get through


class Holder:
    """A thread that takes the gate (shared or exclusive), says so, and lets go when told."""

    def __init__(self, gate: ServingGate, mode: str):
        self.entered = threading.Event()
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(gate, mode), daemon=True)
        self.thread.start()

    def _run(self, gate: ServingGate, mode: str) -> None:
        with getattr(gate, mode)():
            self.entered.set()
            assert self.release.wait(10)

    def done(self) -> None:
        self.release.set()
        self.thread.join(5)
        assert not self.thread.is_alive()


def _waits(holder: Holder) -> bool:
    return not holder.entered.wait(BLOCKED_S)


@pytest.fixture
def gate():
    return ServingGate()


def test_two_requests_hold_it_at_once(gate):
    first, second = Holder(gate, "shared"), Holder(gate, "shared")
    assert first.entered.wait(5) and second.entered.wait(5)
    first.done()
    second.done()


def test_a_step_waits_for_the_requests_being_served_and_holds_back_new_ones(gate):
    serving = Holder(gate, "shared")
    assert serving.entered.wait(5)
    step = Holder(gate, "exclusive")
    assert _waits(step)  # a request is being served
    assert gate.wait_open(0.01) is False  # the serving loop takes no request now
    late = Holder(gate, "shared")
    assert _waits(late)  # the waiting step goes first, though the gate is only shared now
    serving.done()
    assert step.entered.wait(5)
    assert _waits(late)  # the step holds it alone
    step.done()
    assert late.entered.wait(5)
    assert gate.wait_open(0.01) is True
    late.done()


def test_a_step_holds_it_alone(gate):
    step = Holder(gate, "exclusive")
    assert step.entered.wait(5)
    other_step, request = Holder(gate, "exclusive"), Holder(gate, "shared")
    assert _waits(other_step) and _waits(request)
    step.done()
    assert other_step.entered.wait(5)  # steps first: the request waits while one waits
    assert _waits(request)
    other_step.done()
    assert request.entered.wait(5)
    request.done()
