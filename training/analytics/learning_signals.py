"""What a step's rollouts and update say about whether the run can learn, as plain numbers.

Pure functions over the sandbox's records and the trainer's advantages (no database): the step stores
their figures in its metrics, the run page charts them, and the alert rules (training.analytics.alerts)
read them back.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence

MIN_GROUPS_FOR_REPEATS = 4  # fewer scenarios than this say nothing about answers repeated across them
COMPONENT_TOLERANCE = 1e-6  # metrics "add up to the reward" within this
NONZERO = 1e-9  # an advantage smaller than this trains nothing


def truncated(messages: Sequence[dict]) -> bool:
    """The last assistant turn stopped because it reached max_tokens."""
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "assistant":
            return m.get("finish_reason") == "length"
    return False


def answer_repeat(groups: Sequence[Sequence[str]]) -> dict:
    """The final answer found in the most scenarios of the step, and the share of scenarios it is found in.
    `groups`: per scenario, its rollouts' final answers. A policy that says the same thing whatever it is
    asked has found something the reward pays for that is not the task."""
    seen: Counter[str] = Counter()
    for answers in groups:
        seen.update({a.strip() for a in answers if a and a.strip()})
    if len(groups) < MIN_GROUPS_FOR_REPEATS or not seen:
        return {"answer_repeat_share": None}
    answer, count = seen.most_common(1)[0]
    return {"answer_repeat_share": count / len(groups), "answer_repeat_text": answer[:200]}


def _number(value) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def reward_components(trajectories: Sequence[dict], names: Iterable[str] = ()) -> list[str]:
    """The trajectory metrics that make up the reward: those named, else the numeric metrics that add up
    to every scored trajectory's reward (at least two of them, or there is nothing to compare)."""
    names = list(names)
    if names:
        return names
    scored = [t for t in trajectories if t.get("reward") is not None and t.get("metrics")]
    if not scored:
        return []
    common = set.intersection(*({k for k, v in t["metrics"].items() if _number(v) is not None} for t in scored))
    if len(common) < 2:
        return []
    for t in scored:
        if abs(sum(_number(t["metrics"][k]) for k in common) - t["reward"]) > COMPONENT_TOLERANCE:
            return []
    return sorted(common)


def component_shares(trajectories: Sequence[dict], names: Iterable[str] = ()) -> dict:
    """Each reward component's share of the total (mean absolute value over the step's trajectories), and
    the largest. A component that carries nearly all of the reward is often the one being gamed."""
    components = reward_components(trajectories, names)
    if not components:
        return {}
    means = {}
    for name in components:
        values = [_number((t.get("metrics") or {}).get(name)) for t in trajectories]
        values = [abs(v) for v in values if v is not None]
        means[name] = statistics.fmean(values) if values else 0.0
    total = sum(means.values())
    if total <= 0:
        return {}
    top = max(means, key=means.get)
    return {
        "component_top": top,
        "component_top_share": means[top] / total,
        "component_shares": {k: v / total for k, v in means.items()},
    }


def advantage_stats(advantages: Sequence[Sequence[float | None]]) -> dict:
    """How much of the batch the update could learn from: trajectories with a non-zero advantage (the
    effective batch), and the spread of the advantages."""
    flat = [float(a) for group in advantages for a in group if a is not None and math.isfinite(a)]
    if not flat:
        return {}
    return {
        "effective_batch": sum(1 for a in flat if abs(a) > NONZERO),
        "advantage_std": statistics.pstdev(flat) if len(flat) > 1 else 0.0,
        "advantage_abs_mean": statistics.fmean(abs(a) for a in flat),
    }
