"""RULER from the worker's side: a judge endpoint scores a group of trajectory records.

A run's groups are scored inside the sandbox, right after their rollouts, by the same code that
serves a script's `art.rewards` (rollouts/sandbox/guest/artweb_sdk/ruler.py); the judge is reached
through the inference proxy, like the policy. This module lets code outside a sandbox (benchmarks,
checks against a real server) score records with that same prompt and parser, calling the judge
directly.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from rollouts.sandbox.guest.artweb_sdk.ruler import (
    DEFAULT_RUBRIC,
    MAX_CHARS_PER_MESSAGE,
    RulerError,
    TrajectoryScore,
    apply_score,
    group_schema,
    judge_messages,
    parse_scores,
    score_message_lists,
)

__all__ = [
    "DEFAULT_RUBRIC",
    "Judge",
    "RulerError",
    "TrajectoryScore",
    "group_schema",
    "judge_messages",
    "parse_scores",
    "ruler_score_group",
]


@dataclass(frozen=True)
class Judge:
    base_url: str  # an OpenAI-compatible ".../v1" URL
    model: str
    api_key: str = "artweb"
    temperature: float = 0.0
    max_tokens: int | None = None  # None: the server's limit (vLLM: what is left of the context)
    timeout_s: float = 120.0
    max_attempts: int = 3
    max_chars_per_message: int = MAX_CHARS_PER_MESSAGE


def ruler_score_group(
    trajectories: list[dict], judge: Judge, *, rubric: str = DEFAULT_RUBRIC, scenario: dict | None = None
) -> list[dict]:
    """Make the judge's scores the rewards of the records without an error; from synchronous code.

    Returns the same dicts, updated as artweb_sdk.ruler.apply_score says. Raises RulerError when the
    judge gives no usable answer in judge.max_attempts tries.
    """
    scored = [t for t in trajectories if not t.get("error")]
    if not scored:
        return trajectories
    scores = asyncio.run(_score(scored, judge, rubric, scenario))
    for record, score in zip(scored, scores, strict=False):
        apply_score(record, score)
    return trajectories


async def _score(records: list[dict], judge: Judge, rubric: str, scenario: dict | None) -> list[TrajectoryScore]:
    from openai import AsyncOpenAI

    # Records keep sampling details (token ids, logprobs) next to each message; the judge reads the text.
    message_lists = [
        [{k: v for k, v in m.items() if k not in ("token_ids", "logprobs", "finish_reason")} for m in r["messages"]]
        for r in records
    ]
    async with AsyncOpenAI(
        base_url=judge.base_url, api_key=judge.api_key, timeout=judge.timeout_s, max_retries=1
    ) as client:
        return await score_message_lists(
            client,
            judge.model,
            message_lists,
            rubric=rubric,
            scenario=scenario,
            temperature=judge.temperature,
            max_tokens=judge.max_tokens,
            max_attempts=judge.max_attempts,
            max_chars=judge.max_chars_per_message,
        )
