"""Where a step's scored groups come from when artweb does not roll them out itself.

A run driven by an uploaded script rolls out in the sandbox (training.services.steps.batch). A run of
another driver (Run.Driver.CLIENT: an ART client posting its groups, training.client_runs) has a step
source, registered by its app when Django starts: the step asks it for the posted groups, trains them
through the same update, checkpoint and commit as any step, and tells it how the step went. Training
never imports the apps that register sources.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class PostedGroup:
    """One scored group as the step trains it: the shape of a sandbox batch's results."""

    trajectories: list[dict]  # records as rollouts.sandbox.records.check_trajectory accepts them
    judge_s: float = 0.0


@dataclass
class PostedStep:
    """A step's input from a source: the groups, the scenario each belongs to, and the train settings
    the step uses in place of the run's (TrainConfig keys)."""

    key: Any  # the source's own handle (a training job's id)
    scenarios: list  # rollouts.models.Scenario, one per group
    groups: list[PostedGroup]
    settings: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # figures the source adds to the step's metrics


class StepSource(Protocol):
    def pending(self, run) -> bool:
        """Whether a step's input waits (the run is left waiting for its client otherwise)."""

    def take(self, run, step: int) -> PostedStep | None:
        """The oldest waiting input, marked as being trained as `step`."""

    def started(self, posted: PostedStep, *, num_sequences: int) -> None:
        """The update begins on num_sequences sequences."""

    def trained(self, posted: PostedStep, metrics: dict[str, float]) -> None:
        """The update ran; its figures."""

    def committed(self, posted: PostedStep, *, step: int) -> None:
        """Called inside the step's commit transaction: the input became `step`, its checkpoint listed."""

    def failed(self, posted: PostedStep, message: str) -> None:
        """The step ended without a commit; the message says why, for the client."""


_sources: dict[str, StepSource] = {}


def step_source_register(driver: str, source: StepSource) -> None:
    _sources[driver] = source


def step_source(run) -> StepSource | None:
    """The run's step source; None for a run whose rollouts artweb runs itself."""
    return _sources.get(run.driver)
