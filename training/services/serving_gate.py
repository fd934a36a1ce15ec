"""The worker's serving gate: a run step (and a dry run) holds it from start to end, and the serving
thread (training.serving.worker) takes it for each request, so requests to the OpenAI endpoint are
served between steps, never while a batch's rollouts use the inference server.

It stays in training, which the serving app depends on and never the other way round: the step
(training.services.steps) holds it, and the serving thread, which names a step's adapter as the step does,
takes it."""

from __future__ import annotations

import contextlib
import threading

gate = threading.Lock()


@contextlib.contextmanager
def serving_paused():
    """Held by a run step (and a dry run) from start to end: serving requests wait until it is done."""
    with gate:
        yield
