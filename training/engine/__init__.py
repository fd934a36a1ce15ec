"""The pure ML layer: scored trajectory groups → one GRPO update of a LoRA adapter → a checkpoint.

Never imports Django; the `training` app turns database rows into a TrainConfig and calls this.
"""

from training.engine.advantages import Advantages, compute_advantages
from training.engine.checkpoint import CheckpointError
from training.engine.config import ConfigError, TrainConfig
from training.engine.tokenize import TokenizedSequence, TrajectoryError, tokenize_trajectory
from training.engine.trainer import Cancelled, GRPOTrainer, make_trainer

__all__ = [
    "Advantages",
    "Cancelled",
    "CheckpointError",
    "ConfigError",
    "GRPOTrainer",
    "TokenizedSequence",
    "TrainConfig",
    "TrajectoryError",
    "compute_advantages",
    "make_trainer",
    "tokenize_trajectory",
]
