"""The per-step signal figures, from sandbox records and advantages (pure functions)."""

import pytest

from training.analytics.learning_signals import (
    advantage_stats,
    answer_repeat,
    component_shares,
    reward_components,
    truncated,
)


def _t(reward, **metrics):
    return {"reward": reward, "metrics": metrics}


def test_truncation_is_read_from_the_last_assistant_turn():
    assert truncated(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "finish_reason": "length"}]
    )
    assert not truncated(
        [
            {"role": "assistant", "content": "a", "finish_reason": "length"},
            {"role": "tool", "content": "r"},
            {"role": "assistant", "content": "b", "finish_reason": "stop"},
        ]
    )
    assert not truncated([{"role": "user", "content": "q"}])


def test_an_answer_found_in_most_scenarios_is_reported_with_its_share():
    groups = [["Paris", "paris?"], ["Paris"], ["Rome", "Paris "], ["Oslo"]]
    assert answer_repeat(groups) == {"answer_repeat_share": 0.75, "answer_repeat_text": "Paris"}
    assert answer_repeat(groups[:3]) == {"answer_repeat_share": None}  # too few scenarios to say anything


def test_components_are_the_metrics_that_add_up_to_the_reward():
    trajs = [_t(1.5, fmt=1.0, correct=0.5, words=7), _t(1.0, fmt=1.0, correct=0.0, words=3)]
    # words is a metric too, and fmt + correct + words is not the reward: no components (the shipped example's
    # metrics are like this: used_word, words, brevity).
    assert reward_components(trajs) == []
    assert reward_components([_t(1.5, fmt=1.0, correct=0.5), _t(1.0, fmt=1.0, correct=0.0)]) == ["correct", "fmt"]
    shares = component_shares([_t(1.5, fmt=1.0, correct=0.5), _t(1.0, fmt=1.0, correct=0.0)])
    assert shares["component_top"] == "fmt"
    assert shares["component_top_share"] == pytest.approx(1.0 / 1.25)
    named = component_shares(trajs, ["fmt", "correct"])
    assert named["component_shares"] == pytest.approx({"fmt": 0.8, "correct": 0.2})


def test_the_effective_batch_counts_trajectories_with_an_advantage():
    stats = advantage_stats([[1.0, -1.0, 0.0], [0.0, 0.0], [0.5, None, -0.5]])
    assert stats["effective_batch"] == 4
    assert stats["advantage_abs_mean"] == pytest.approx(3.0 / 7)
    assert stats["advantage_std"] == pytest.approx((2.5 / 7) ** 0.5)
    assert advantage_stats([]) == {}
