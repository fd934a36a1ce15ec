"""artweb's rollout SDK, also importable as `art`: scripts written for OpenPipe's ART run unchanged.

import art

async def rollout(model: art.Model, scenario) -> art.Trajectory:
    client = model.openai_client()
    completion = await client.chat.completions.create(
        model=model.name, messages=[{"role": "user", "content": scenario.prompt}])
    trajectory = art.Trajectory(messages_and_choices=[...], reward=0.0)
    trajectory.messages_and_choices.append(completion.choices[0])
    return trajectory
"""

from .gather import TooManyExceptions, gather_trajectory_groups
from .model import LocalBackend, Model, TrainableModel, TrainConfig
from .scenario import Scenario
from .trajectory import Trajectory, TrajectoryGroup

__all__ = [
    "LocalBackend",
    "Model",
    "Scenario",
    "TooManyExceptions",
    "TrainConfig",
    "TrainableModel",
    "Trajectory",
    "TrajectoryGroup",
    "gather_trajectory_groups",
]
