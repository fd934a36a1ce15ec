import math

import pytest

from training.engine.advantages import compute_advantages, group_advantages


def test_it_centres_and_scales_by_the_population_std():
    # mean 0.5, population std 0.5 → ±0.5 / (0.5 + 1e-6)
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    expected = 0.5 / (0.5 + 1e-6)
    assert adv == pytest.approx([expected, -expected, -expected, expected], abs=1e-12)


def test_it_only_centres_when_scaling_is_off():
    # mean 2, deviations -1, 0, +1
    assert group_advantages([1.0, 2.0, 3.0], scale_rewards=False) == pytest.approx([-1.0, 0.0, 1.0])


def test_it_excludes_none_rewards_from_the_statistics():
    # scored rewards [0, 3]: mean 1.5, std 1.5
    adv = group_advantages([0.0, None, 3.0])
    assert adv[1] is None
    assert adv[0] == pytest.approx(-1.5 / (1.5 + 1e-6))
    assert adv[2] == pytest.approx(1.5 / (1.5 + 1e-6))


def test_it_skips_groups_without_signal():
    rewards = [[0.1, 0.1, 0.1], [1.0, None], [None, None], [], [0.0, 1.0]]
    result = compute_advantages(rewards)
    assert result.used == [False, False, False, False, True]
    assert result.groups_skipped == 4 and result.groups_used == 1
    # Skipped groups come back shaped like the input: exact zeros, None for unscored.
    assert result.values[0] == [0.0, 0.0, 0.0]
    assert result.values[1] == [0.0, None]
    assert result.values[2] == [None, None]


def test_it_reads_rewards_from_trajectory_dicts_and_drops_nan():
    groups = [[{"reward": 2.0}, {"reward": 0.0}, {"reward": float("nan")}, {"messages": []}]]
    values = compute_advantages(groups, scale_rewards=False).values[0]
    assert values[:2] == [1.0, -1.0] and values[2] is None and values[3] is None
    assert not any(v is not None and math.isnan(v) for v in values)
