"""When the GPU worker hands freed memory back after a step (inference.release_memory).

A trim hands back the update's working set too, which the next update faults in again at about half
speed; so the worker trims only when its resident memory keeps growing, never in a steady run. What the
trim saves and costs is measured by bench/worker_memory.py and bench/run_curve.py, not here.
"""

from __future__ import annotations

import threading

import pytest

from training.services import inference

GiB = 1 << 30


@pytest.fixture(autouse=True)
def fresh_reference(monkeypatch):
    monkeypatch.setattr(inference, "_resident_reference", None)


def decisions(residents: list[float]) -> list[bool]:
    return [inference._trim_due(int(r * GiB)) for r in residents]


def test_a_steady_run_whose_batches_vary_in_size_is_never_trimmed():
    # The first step sets the reference; later batches up to RSS_GROWTH times its memory are a run's spread.
    assert decisions([2.0, 2.6, 2.2, 2.9, 2.4, 2.5]) == [False] * 6


def test_a_worker_whose_memory_ratchets_up_is_trimmed_then_measured_again():
    # 0.4 GiB more after every step (a copy of the weights left behind each time): trimmed once it passes
    # RSS_GROWTH x the first step's; the step after the trim sets the reference again.
    assert decisions([2.0, 2.4, 2.8, 3.2, 1.9, 2.3, 2.7, 3.1]) == [False, False, False, True, False, False, False, True]


def test_release_memory_trims_on_a_thread_of_its_own_when_the_memory_grew():
    inference._trim_due(1)  # a reference far below what this process holds now
    inference.release_memory()
    trims = [t for t in threading.enumerate() if t.name == "malloc-trim"]
    for t in trims:
        t.join(timeout=30)
    assert trims and not any(t.is_alive() for t in trims)
    assert inference._resident_reference is None  # set again after the next step

    inference.release_memory()  # that step: it sets the reference and trims nothing
    assert inference._resident_reference is not None
    assert not [t for t in threading.enumerate() if t.name == "malloc-trim" and t.is_alive()]
