"""What every exporter gets and may raise."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from training.models import ExportProgress, ExportTarget, Run, Step


class ExportError(Exception):
    """An export attempt failed (bad key, service down, refused payload). Retried with backoff."""


@dataclass
class ExportJob:
    """One attempt to bring a target up to date with a run.

    steps: the Step rows after the target's cursor, in order. final: the run has ended and its end is
    not exported yet. done(step) advances the cursor; call it only once the service has the step.
    worker_env: whatever the settings and secret leave empty may come from the worker's environment
    (the operator's own targets only; see selectors.export_target_uses_worker_env).
    """

    target: ExportTarget
    run: Run
    progress: ExportProgress
    steps: list[Step]
    final: bool
    settings: object  # the kind's validated settings model
    secret: str
    done: Callable[[int], None] = field(repr=False, default=lambda step: None)
    worker_env: bool = False
