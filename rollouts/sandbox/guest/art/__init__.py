"""`import art` inside artweb's sandbox: the artweb SDK under ART's name, with ART 0.5.18's rollout-side API.

The submodules scripts import from are here too, under ART's names (`from art.utils import iterate_dataset`,
`art.types.Messages`, `art.dev.InternalModelConfig`, ...). What artweb cannot honour inside the sandbox
raises art.NotSupportedInSandbox, which names the feature and says why.
"""

from typing import Any

from artweb_sdk import (
    Backend,
    History,
    LocalBackend,
    LocalTrainResult,
    Model,
    NotSupportedInSandbox,
    Scenario,
    ServerlessBackend,
    ServerlessTrainResult,
    TooManyExceptions,
    TrainableModel,
    TrainConfig,
    TrainResult,
    TrainSFTConfig,
    Trajectory,
    TrajectoryGroup,
    gather_trajectories,
    gather_trajectory_groups,
    retry,
    trajectory_group_batches,
)

# ART's submodules, reached as attributes after a plain `import art`, as in ART.
from . import (  # noqa: F401
    backend,
    batches,
    dev,
    gather,
    langgraph,
    local,
    mcp,
    model,
    rewards,
    serverless,
    trajectories,
    types,
    utils,
)

# As in ART, the function takes the name of the module it comes from.
from .auto_trajectory import auto_trajectory, capture_auto_trajectory
from .yield_trajectory import capture_yielded_trajectory, yield_trajectory

__all__ = [
    "Backend",
    "History",
    "LocalBackend",
    "LocalTrainResult",
    "Messages",
    "MessagesAndChoices",
    "Model",
    "NotSupportedInSandbox",
    "Scenario",
    "ServerlessBackend",
    "ServerlessTrainResult",
    "TooManyExceptions",
    "Tools",
    "TrainConfig",
    "TrainResult",
    "TrainSFTConfig",
    "TrainableModel",
    "Trajectory",
    "TrajectoryGroup",
    "auto_trajectory",
    "capture_auto_trajectory",
    "capture_yielded_trajectory",
    "dev",
    "gather_trajectories",
    "gather_trajectory_groups",
    "retry",
    "trajectory_group_batches",
    "yield_trajectory",
]


def __getattr__(name: str) -> Any:
    # Messages, MessagesAndChoices, Tools: OpenAI's types, imported on first use (see artweb_sdk.types).
    if name in ("Messages", "MessagesAndChoices", "Tools"):
        return getattr(types, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
