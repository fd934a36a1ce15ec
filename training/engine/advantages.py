"""Group-relative advantages (GRPO): each reward against the other rollouts of the same scenario."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Added to the group standard deviation so a group of nearly equal rewards doesn't blow up (ART's value).
STD_EPSILON = 1e-6


@dataclass(frozen=True)
class Advantages:
    # One list per group, one entry per trajectory, shaped like the input: None where the reward was None.
    values: list[list[float | None]]
    # used[g]: group g carries a signal (at least two scored rollouts with different rewards).
    used: list[bool]

    @property
    def groups_used(self) -> int:
        return sum(self.used)

    @property
    def groups_skipped(self) -> int:
        return len(self.used) - self.groups_used


def group_advantages(rewards: list[float | None], scale_rewards: bool = True) -> list[float | None] | None:
    """Advantages of one group, or None when the group has no signal.

    reward - mean(rewards), divided by (population std + 1e-6) when scale_rewards. None rewards (failed
    rollouts, unscored ones) are left out of the statistics and get a None advantage. Groups whose scored
    rewards are all equal are reported as None rather than as zeros computed in floating point, which for
    rewards like [0.1, 0.1, 0.1] would come out as tiny non-zero values.
    """
    scored = [r for r in rewards if r is not None]
    if len(scored) < 2 or max(scored) == min(scored):
        return None
    mean = sum(scored) / len(scored)
    std = math.sqrt(sum((r - mean) ** 2 for r in scored) / len(scored))
    scale = 1.0 / (std + STD_EPSILON) if scale_rewards else 1.0
    return [None if r is None else (r - mean) * scale for r in rewards]


def compute_advantages(groups: list[list[Any]], scale_rewards: bool = True) -> Advantages:
    """Advantages for every group. `groups` holds rewards (float | None) or trajectory dicts with a
    "reward" key. Skipped groups get 0.0 for each scored trajectory, None for the unscored ones."""
    values: list[list[float | None]] = []
    used: list[bool] = []
    for group in groups:
        rewards = [_reward_of(item) for item in group]
        advantages = group_advantages(rewards, scale_rewards)
        used.append(advantages is not None)
        values.append(advantages if advantages is not None else [None if r is None else 0.0 for r in rewards])
    return Advantages(values=values, used=used)


def _reward_of(item: Any) -> float | None:
    reward = item.get("reward") if isinstance(item, dict) else item
    if reward is None:
        return None
    reward = float(reward)
    # A NaN or infinite reward is a broken reward function; treat it like a missing score.
    return reward if math.isfinite(reward) else None
