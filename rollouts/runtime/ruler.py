"""RULER: score a group of trajectories relative to each other with a judge model.

When a task has no clean metric, a judge reading the whole group side by side ranks it more
consistently than one scoring each trajectory alone, and GRPO only needs the relative order. The
judge is any OpenAI-compatible endpoint (by default the local vLLM base model). Its answer is JSON,
requested with a schema where the server supports one, and parsed leniently (code fences, text around
the object) with retries. The reward the trajectory had before is kept in its metrics.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass

from openai import BadRequestError, OpenAI

logger = logging.getLogger(__name__)

DEFAULT_RUBRIC = """\
- A trajectory that achieves the user's goal scores higher than one that does not.
- Between two that both achieve it, the more efficient and more careful one scores higher.
- Give partial credit to progress towards the goal, even without completing it.
- Scores range from 0 (useless) to 1 (ideal)."""

SCHEMA = {
    "type": "object",
    "properties": {
        "scores": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "trajectory_id": {"type": "string"},
                    "explanation": {"type": "string"},
                    "score": {"type": "number", "minimum": 0, "maximum": 1},
                },
                "required": ["trajectory_id", "explanation", "score"],
            },
        }
    },
    "required": ["scores"],
}


def group_schema(n: int) -> dict:
    """SCHEMA with exactly n scores: with guided decoding, even a small judge cannot give a wrong count."""
    scores = {**SCHEMA["properties"]["scores"], "minItems": n, "maxItems": n}
    return {**SCHEMA, "properties": {"scores": scores}}


class RulerError(RuntimeError):
    pass


@dataclass(frozen=True)
class Judge:
    base_url: str
    model: str
    api_key: str = "artweb"
    temperature: float = 0.0
    max_tokens: int = 1024
    timeout_s: float = 120.0
    max_attempts: int = 3
    max_chars_per_message: int = 2000  # long tool outputs are cut so the group fits the judge's context


def _render(trajectory: dict, limit: int) -> str:
    lines = []
    for m in trajectory["messages"]:
        content = m.get("content") or ""
        if not isinstance(content, str):
            content = json.dumps(content)
        if len(content) > limit:
            content = content[:limit] + " […]"
        calls = "".join(f"\n[calls {c['function']['name']}({c['function']['arguments']})]" for c in m.get("tool_calls") or [])
        lines.append(f"{m.get('role', '?')}: {content}{calls}")
    return "\n".join(lines)


def build_prompt(trajectories: list[dict], rubric: str, limit: int, scenario: dict | None = None) -> list[dict]:
    parts = [f'<trajectory id="{i + 1}">\n{_render(t, limit)}\n</trajectory>' for i, t in enumerate(trajectories)]
    task = f"The task the agent was given:\n{json.dumps(scenario, ensure_ascii=False)[:limit]}\n\n" if scenario else ""
    system = (
        "You judge attempts by an AI agent at the same task, comparing them with each other. "
        f"Grading rubric:\n{rubric}\n\n"
        'Answer with JSON only: {"scores": [{"trajectory_id": "1", "explanation": "...", "score": 0.0}, ...]}, '
        "one entry per trajectory, in order."
    )
    user = f"{task}{len(trajectories)} attempts follow.\n\n" + "\n\n".join(parts)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def parse_scores(text: str, count: int) -> tuple[list[float], list[str]]:
    """Scores and explanations from the judge's reply; raises ValueError if they cannot be read."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object in the judge's reply")
    data, _ = json.JSONDecoder().raw_decode(text[start:])
    entries = data.get("scores") if isinstance(data, dict) else None
    if not isinstance(entries, list) or len(entries) != count:
        raise ValueError(f"expected {count} scores, got {len(entries) if isinstance(entries, list) else 'none'}")
    by_id = {}
    for position, entry in enumerate(entries):
        key = str(entry.get("trajectory_id", position + 1)).strip().strip('"')
        by_id[key if key.isdigit() else str(position + 1)] = entry
    scores, explanations = [], []
    for i in range(count):
        entry = by_id.get(str(i + 1)) or entries[i]
        score = float(entry["score"])
        if not math.isfinite(score):
            raise ValueError(f"score {score} for trajectory {i + 1}")
        scores.append(min(1.0, max(0.0, score)))
        explanations.append(str(entry.get("explanation", "")))
    return scores, explanations


def ruler_score_group(trajectories: list[dict], judge: Judge, *, rubric: str = DEFAULT_RUBRIC,
                      scenario: dict | None = None) -> list[dict]:
    """Set each trajectory's reward to the judge's score; failed trajectories are left as they are.

    Returns the same dicts, updated: reward, metrics["independent_reward"] (the reward before),
    metrics["ruler_score"], metadata["ruler_explanation"]. Raises RulerError when the judge gives no
    usable answer after judge.max_attempts tries.
    """
    scored = [t for t in trajectories if not t.get("error")]
    if len(scored) < 2:
        return trajectories  # nothing to compare
    client = OpenAI(base_url=judge.base_url, api_key=judge.api_key, timeout=judge.timeout_s, max_retries=1)
    messages = build_prompt(scored, rubric, judge.max_chars_per_message, scenario)
    structured = True
    last_error: Exception | None = None
    for attempt in range(judge.max_attempts):
        kwargs = {"response_format": {"type": "json_schema",
                                      "json_schema": {"name": "ruler_scores", "schema": group_schema(len(scored))}}}
        try:
            completion = client.chat.completions.create(
                model=judge.model, messages=messages, max_tokens=judge.max_tokens,
                # A little temperature on retries, so a judge stuck on a bad answer can leave it.
                temperature=judge.temperature + 0.3 * attempt, **(kwargs if structured else {}),
            )
        except BadRequestError as exc:
            if structured:  # the endpoint does not take a schema: ask for JSON in words only
                structured, last_error = False, exc
                continue
            raise RulerError(f"The judge endpoint refused the request: {exc}") from exc
        text = completion.choices[0].message.content or ""
        try:
            scores, explanations = parse_scores(text, len(scored))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            logger.info("RULER attempt %d: unusable reply (%s): %.200s", attempt + 1, exc, text)
            last_error = exc
            continue
        for trajectory, score, why in zip(scored, scores, explanations):
            trajectory["metrics"] = {**trajectory.get("metrics", {}), "independent_reward": trajectory.get("reward"),
                                     "ruler_score": score}
            trajectory["metadata"] = {**trajectory.get("metadata", {}), "ruler_explanation": why[:2000]}
            trajectory["reward"] = score
        return trajectories
    raise RulerError(f"The judge gave no usable scores in {judge.max_attempts} attempts: {last_error}")
