"""The shipped example task, outside the sandbox: its scenarios, prompts and reward, for the benchmarks.

Both trainers of the head-to-head benchmark see exactly what an artweb run sees: the same scenario
files, the same per-step scenario sample (`train_schedule` repeats the run's seeded sampling), the same
system prompt (read from the rollout script, never copied) and the same reward function file.
"""

from __future__ import annotations

import ast
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[1] / "rollouts" / "examples"


def example_run(owner, name: str, model, config: dict):
    """A run of the shipped example task (its script, reward and scenarios uploaded as `name` by `owner`) on
    `model`, created as the launch form creates one. Needs Django set up."""
    from rollouts.services import reward_create, scenario_set_create, script_create
    from training.services import run_create

    return run_create(
        owner=owner,
        name=name,
        base_model=model,
        script_version=script_create(owner=owner, name=name, content=(EXAMPLES / "rollout.py").read_text()),
        reward_version=reward_create(owner=owner, name=name, content=(EXAMPLES / "reward.py").read_text()),
        scenario_set=scenario_set_create(owner=owner, name=name, jsonl=(EXAMPLES / "scenarios.jsonl").read_text()),
        config=config,
    )


def load_scenarios(path: Path = EXAMPLES / "scenarios.jsonl") -> dict[str, list[dict]]:
    """Scenarios by split, in file order (the order artweb stores them in)."""
    by_split: dict[str, list[dict]] = {"train": [], "val": []}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            by_split.setdefault(row.get("split", "train"), []).append(row)
    return by_split


def system_prompt(path: Path = EXAMPLES / "rollout.py") -> str:
    """The SYSTEM constant of the example rollout script."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SYSTEM" for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"{path} defines no SYSTEM string")


def messages_for(scenario: dict) -> list[dict]:
    return [{"role": "system", "content": system_prompt()}, {"role": "user", "content": scenario["prompt"]}]


def train_schedule(scenarios: list[dict], steps: int, per_step: int, seed: int = 0) -> list[list[dict]]:
    """The scenarios an artweb run with this seed samples at steps 1..steps (same seeding as the step loop)."""
    schedule = []
    for step in range(1, steps + 1):
        rng = random.Random(f"{seed}:train:{step}")
        if per_step <= len(scenarios):
            chosen = rng.sample(range(len(scenarios)), per_step)
        else:
            chosen = [rng.choice(range(len(scenarios))) for _ in range(per_step)]
        schedule.append([scenarios[i] for i in chosen])
    return schedule


@dataclass
class _Scored:
    """The slice of a trajectory a reward function reads: messages() and a metrics dict."""

    _messages: list[dict]
    metrics: dict[str, Any] = field(default_factory=dict)

    def messages(self) -> list[dict]:
        return self._messages


def load_reward(path: Path = EXAMPLES / "reward.py") -> Callable[[list[dict], str], float]:
    """reward(scenario, answer) -> float, from the example reward file."""
    namespace: dict[str, Any] = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    fn = namespace["reward"]

    def score(scenario: dict, answer: str) -> float:
        messages = [*messages_for(scenario), {"role": "assistant", "content": answer}]
        return float(fn(_Scored(messages), SimpleNamespace(**scenario)))

    return score
