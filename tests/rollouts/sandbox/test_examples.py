"""The shipped example task: well-formed scenarios and a bounded reward with partial credit."""

import json
import sys
from pathlib import Path

from rollouts.sandbox.validation import validate_reward, validate_script

from .conftest import EXAMPLES

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "rollouts" / "sandbox" / "guest"))

import artweb_sdk as art


def load_reward():
    namespace = {}
    exec(compile((EXAMPLES / "reward.py").read_text(), "reward.py", "exec"), namespace)
    return namespace["reward"]


def test_the_examples_validate():
    assert validate_script((EXAMPLES / "rollout.py").read_text()) == []
    assert validate_script((EXAMPLES / "tool_rollout.py").read_text()) == []
    assert validate_reward((EXAMPLES / "reward.py").read_text()) == ("trajectory", [])


def test_the_scenarios_have_both_splits():
    scenarios = [json.loads(line) for line in (EXAMPLES / "scenarios.jsonl").read_text().splitlines()]
    assert 50 <= len(scenarios) <= 80
    splits = {s.get("split") for s in scenarios}
    assert {"train", "validation"} <= splits
    assert all({"prompt", "word", "max_words"} <= set(s) for s in scenarios)


def test_the_reward_gives_partial_credit_within_bounds():
    reward = load_reward()
    scenario = art.Scenario({"word": "blue", "max_words": 8})

    def score(answer):
        return reward(art.Trajectory(messages_and_choices=[{"role": "assistant", "content": answer}]), scenario)

    assert score("The blue sea is calm.") == 1.0
    assert score("The sea is calm.") == 0.5
    assert 0.5 < score("The blue sea is calm and wide and deep and old and full of fish.") < 1.0
    assert score("") == 0.0
    assert all(0.0 <= score(a) <= 1.0 for a in ("blue " * 100, "x", "Blue!"))
