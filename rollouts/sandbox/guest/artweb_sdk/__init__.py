"""artweb's rollout SDK, also importable as `art`: scripts written for OpenPipe's ART run unchanged.

import art

async def rollout(model: art.Model, scenario) -> art.Trajectory:
    client = model.openai_client()
    completion = await client.chat.completions.create(
        model=model.name, messages=[{"role": "user", "content": scenario.prompt}])
    trajectory = art.Trajectory(messages_and_choices=[...], reward=0.0)
    trajectory.messages_and_choices.append(completion.choices[0])
    return trajectory

The names follow ART 0.5.18's rollout-side API. What artweb cannot honour inside the sandbox raises
NotSupportedInSandbox, naming the feature and saying why.
"""

from typing import Any

from . import dev, types, utils  # noqa: F401 - reached as attributes, as in ART
from .capture import auto_trajectory, capture_auto_trajectory, capture_yielded_trajectory, yield_trajectory
from .errors import NotSupportedInSandbox
from .gather import TooManyExceptions, gather_trajectories, gather_trajectory_groups, trajectory_group_batches
from .model import Backend, LocalBackend, Model, ServerlessBackend, TrainableModel
from .scenario import Scenario
from .trajectory import History, Trajectory, TrajectoryGroup
from .types import LocalTrainResult, ServerlessTrainResult, TrainConfig, TrainResult, TrainSFTConfig
from .utils import retry

# Names looked up on first use (artweb_sdk.types): they import the OpenAI library.
LAZY = ("Messages", "MessagesAndChoices", "Tools")

__all__ = [
    "Backend",
    "History",
    "LocalBackend",
    "LocalTrainResult",
    "Model",
    "NotSupportedInSandbox",
    "Scenario",
    "ServerlessBackend",
    "ServerlessTrainResult",
    "TooManyExceptions",
    "TrainConfig",
    "TrainResult",
    "TrainSFTConfig",
    "TrainableModel",
    "Trajectory",
    "TrajectoryGroup",
    "auto_trajectory",
    "capture_auto_trajectory",
    "capture_yielded_trajectory",
    "gather_trajectories",
    "gather_trajectory_groups",
    "retry",
    "trajectory_group_batches",
    "yield_trajectory",
]


def __getattr__(name: str) -> Any:
    if name in LAZY:
        return getattr(types, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
