"""RULER: a judge model scores the trajectories of one group side by side (ART's `art.rewards`).

GRPO only uses how the rollouts of one scenario compare with each other, and a judge reading the
whole group at once ranks it far more consistently than one scoring each trajectory alone; so a judge
can stand in for a reward function where a task has no clean metric.

This module is artweb's one implementation of the judge's prompt and of reading its answer. It runs
in the sandbox (a script's `art.rewards.ruler_score_group`, and artweb's own scoring of a run's groups
when the run uses RULER) and in the worker (rollouts.sandbox.ruler), so it needs nothing but openai.
Inside the sandbox the judge is reached like the policy, through the inference proxy, which passes
only the model names the batch may use; the judge's name is in ARTWEB_JUDGE_MODEL, its key stays with
the worker.

Where ART differs: `judge_model` defaults to the batch's judge (ART's default, "openai/o3", is out of a
sandbox's reach), and a litellm provider prefix on the judge's name ("hosted_vllm/<name>") is dropped,
since the proxy routes by the served name.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from typing import Any

from .capture import auto_context
from .trajectory import Trajectory, TrajectoryGroup, message_dict

JUDGE_ENV = "ARTWEB_JUDGE_MODEL"
PROVIDER_PREFIXES = ("hosted_vllm/", "openai/", "litellm_proxy/")
# litellm settings that choose where a request goes; in the sandbox there is one way out, so they are
# dropped rather than sent to the judge as unknown request fields.
ROUTING_PARAMS = frozenset(
    {"api_base", "base_url", "api_key", "custom_llm_provider", "api_version", "azure_ad_token_provider", "caching"}
)
MAX_CHARS_PER_MESSAGE = 2000  # long tool outputs are cut so a group fits a small judge's context
# An explanation is a sentence or two; the bound is in the schema, so a small judge cannot spend its whole
# token budget on the first trajectory and leave the JSON unfinished.
MAX_EXPLANATION_CHARS = 200

DEFAULT_RUBRIC = """\
- A trajectory that achieves its goal scores clearly higher than one that does not.
- Between two that achieve it, the one that gets there more directly (fewer detours, fewer wasted
  calls) scores higher.
- Small differences in quality deserve small differences in score; large ones, large differences.
- Progress towards the goal earns partial credit, even without completing it.
- Scores range from 0 (useless) to 1 (ideal)."""


class RulerError(RuntimeError):
    """The judge gave no usable scores; the message says why and what to change."""


@dataclass(frozen=True)
class TrajectoryScore:
    trajectory_id: str  # "1" for the first trajectory of the group, and so on
    explanation: str  # the judge's reason, in its own words
    score: float  # in [0, 1]


def group_schema(n: int) -> dict:
    """The JSON the judge must answer with: exactly n scores, so that with guided decoding even a small
    judge cannot return a wrong count, and short explanations."""
    entry = {
        "type": "object",
        "properties": {
            "trajectory_id": {"type": "string"},
            "explanation": {"type": "string", "maxLength": MAX_EXPLANATION_CHARS},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["trajectory_id", "explanation", "score"],
    }
    return {
        "type": "object",
        "properties": {"scores": {"type": "array", "items": entry, "minItems": n, "maxItems": n}},
        "required": ["scores"],
    }


# --- the prompt ----------------------------------------------------------------------------------


def _render(messages: list[dict], limit: int) -> str:
    lines = []
    for m in messages:
        content = m.get("content") or ""
        if not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False)
        if len(content) > limit:
            content = content[:limit] + " […]"
        calls = "".join(
            f"\n[calls {c['function']['name']}({c['function']['arguments']})]" for c in m.get("tool_calls") or []
        )
        lines.append(f"{m.get('role', '?')}: {content}{calls}")
    return "\n".join(lines) if lines else "(no further messages)"


def _shared_prefix(message_lists: list[list[dict]]) -> int:
    """How many leading messages every trajectory has in common (a system prompt, the task)."""
    n = 0
    for messages in zip(*message_lists, strict=False):
        if any(m != messages[0] for m in messages[1:]):
            break
        n += 1
    return n


def judge_messages(
    message_lists: list[list[dict]],
    rubric: str = DEFAULT_RUBRIC,
    *,
    scenario: Any = None,
    max_chars: int = MAX_CHARS_PER_MESSAGE,
) -> list[dict]:
    """The chat messages asking the judge to score each message list; ids are "1".."n" in order.

    Messages every trajectory starts with are shown once, before the trajectories: the judge reads the
    task once and the group fits a smaller context.
    """
    shared = _shared_prefix(message_lists) if len(message_lists) > 1 else 0
    parts = []
    if scenario:
        task = json.dumps(scenario, ensure_ascii=False, default=str)[:max_chars]
        parts.append(f"<scenario>\nThe data the agent was given for this task:\n{task}\n</scenario>")
    if shared:
        parts.append(
            f"<context>\nEvery trajectory starts with these messages:\n"
            f"{_render(message_lists[0][:shared], max_chars)}\n</context>"
        )
    for i, messages in enumerate(message_lists, start=1):
        parts.append(f'<trajectory id="{i}">\n{_render(messages[shared:], max_chars)}\n</trajectory>')
    system = (
        "You are judging attempts by an AI agent at one and the same task. Compare them with each other "
        "and give each a score between 0 and 1, following your best understanding of the agent's goal.\n\n"
        f"Grading rubric:\n{rubric.strip()}\n\n"
        'Answer with JSON only: {"scores": [{"trajectory_id": "1", "explanation": "...", "score": 0.5}, ...]}, '
        "one entry per trajectory, in order, each explained in one short sentence."
    )
    user = f"{len(message_lists)} trajectories follow.\n\n" + "\n\n".join(parts)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def parse_scores(text: str, count: int) -> list[TrajectoryScore]:
    """The judge's scores for trajectories "1".."count"; ValueError when its reply cannot be read.

    Lenient about what surrounds the JSON object (code fences, a sentence before it) and about ids the
    judge garbled (then position decides); strict about the count and about each score being a number.
    """
    start = text.find("{")
    if start < 0:
        raise ValueError("there is no JSON object in the judge's reply")
    try:
        data, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        raise ValueError(f"the judge's reply is not valid JSON ({exc})") from None
    entries = data.get("scores") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError('the judge\'s reply has no "scores" list of objects')
    if len(entries) != count:
        raise ValueError(f"the judge gave {len(entries)} scores for {count} trajectories")
    # Entries with a usable id go to that trajectory; the others fill the remaining places in order.
    slots: list[dict | None] = [None] * count
    unplaced = []
    for entry in entries:
        key = str(entry.get("trajectory_id", "")).strip().strip('"')
        if key.isdigit() and 1 <= int(key) <= count and slots[int(key) - 1] is None:
            slots[int(key) - 1] = entry
        else:
            unplaced.append(entry)
    fill = iter(unplaced)
    scores = []
    for i, entry in enumerate(slots, start=1):
        entry = entry if entry is not None else next(fill)
        try:
            score = float(entry["score"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"trajectory {i} has no numeric score") from None
        if not math.isfinite(score):
            raise ValueError(f"trajectory {i} has the score {score}")
        scores.append(
            TrajectoryScore(
                trajectory_id=str(i),
                score=min(1.0, max(0.0, score)),
                explanation=str(entry.get("explanation", ""))[:MAX_EXPLANATION_CHARS],
            )
        )
    return scores


# --- asking the judge ------------------------------------------------------------------------------


async def score_message_lists(
    client: Any,
    model: str,
    message_lists: list[list[dict]],
    *,
    rubric: str = DEFAULT_RUBRIC,
    scenario: Any = None,
    temperature: float = 0.0,
    max_tokens: int | None = None,
    max_attempts: int = 3,
    max_chars: int = MAX_CHARS_PER_MESSAGE,
    extra_body: dict | None = None,
    debug: bool = False,
) -> list[TrajectoryScore]:
    """One score per message list from the judge `model`, asked through `client` (an AsyncOpenAI).

    The answer is requested with a JSON schema; an endpoint that refuses schemas is asked in words
    only. A reply that cannot be read is asked again, a little warmer each time, so that a judge stuck on
    a bad answer can leave it. max_tokens None lets the server bound the reply (vLLM: what is left of
    the context), so a long group never asks for more than fits. Raises RulerError.
    """
    import openai

    if not message_lists:
        return []
    # Identical trajectories get one score: the judge reads one, and the group carries no signal anyway.
    identical = len(message_lists) > 1 and all(m == message_lists[0] for m in message_lists[1:])
    judged = message_lists[:1] if identical else message_lists
    messages = judge_messages(judged, rubric, scenario=scenario, max_chars=max_chars)
    structured, problem = True, "no attempt was made"
    for attempt in range(max_attempts):
        kwargs: dict[str, Any] = {}
        if structured:
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "ruler_scores", "schema": group_schema(len(judged))},
            }
        if max_tokens is not None:
            kwargs["max_tokens"] = max_tokens
        if extra_body:
            kwargs["extra_body"] = extra_body
        try:
            completion = await client.chat.completions.create(
                model=model, messages=messages, temperature=temperature + 0.3 * attempt, **kwargs
            )
        except openai.NotFoundError as exc:
            raise RulerError(f"The judge model `{model}` is not available: {_api_message(exc)}") from None
        except openai.BadRequestError as exc:
            if structured:
                structured, problem = False, _api_message(exc)
                continue
            raise RulerError(f"The judge `{model}` refused the request: {_api_message(exc)}") from None
        except openai.APIError as exc:
            raise RulerError(f"The judge `{model}` failed to answer: {_api_message(exc)}") from None
        text = (completion.choices[0].message.content or "") if completion.choices else ""
        if debug:
            print(f"[RULER] the judge's reply (attempt {attempt + 1}):\n{text}")
        try:
            scores = parse_scores(text, len(judged))
        except ValueError as exc:
            problem = str(exc)
            continue
        if identical:
            scores = [replace(scores[0], trajectory_id=str(i)) for i in range(1, len(message_lists) + 1)]
        return scores
    raise RulerError(f"The judge `{model}` gave no usable scores in {max_attempts} attempts: {problem}.")


def apply_score(record: dict, score: TrajectoryScore) -> None:
    """Make the judge's score a trajectory record's reward (the JSON shape the sandbox sends back).

    As in ART, the reward it had before (a reward function's, or the script's own) is kept in
    metrics["independent_reward"]; the judge's reason goes to metadata["ruler_explanation"].
    """
    metrics = dict(record.get("metrics") or {})
    if record.get("reward") is not None:
        metrics["independent_reward"] = record["reward"]
    metrics["ruler_score"] = score.score
    record.update(
        reward=score.score,
        metrics=metrics,
        metadata={**(record.get("metadata") or {}), "ruler_explanation": score.explanation},
    )


def _api_message(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        message = (
            (body.get("error") or {}).get("message") if isinstance(body.get("error"), dict) else body.get("message")
        )
        if message:
            return str(message)
    return str(exc)


# --- ART's API -------------------------------------------------------------------------------------


def batch_judge() -> str | None:
    """The judge model this sandbox's batch may call, if any."""
    return os.environ.get(JUDGE_ENV) or None


def judge_name(judge_model: str | None) -> str:
    """The served name to ask for: the batch's judge when none is given; a provider prefix dropped."""
    judge = batch_judge()
    if judge_model is None:
        if judge is None:
            raise RulerError(
                "This batch has no judge model. Turn on RULER in the run's settings (the run's base "
                "model then judges), or pass judge_model= a model this batch may call."
            )
        return judge
    for prefix in PROVIDER_PREFIXES:
        rest = judge_model.removeprefix(prefix)
        if rest != judge_model and (prefix == "hosted_vllm/" or rest == judge):
            return rest
    return judge_model


def judge_client():
    """An AsyncOpenAI client for the judge; in the sandbox it reaches the inference proxy."""
    from openai import AsyncOpenAI

    return AsyncOpenAI(
        base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"),
        api_key=os.environ.get("OPENAI_API_KEY", "artweb"),
        max_retries=1,
        timeout=600.0,
    )


def _request_options(extra_litellm_params: dict | None) -> tuple[dict, dict]:
    params = {k: v for k, v in (extra_litellm_params or {}).items() if k not in ROUTING_PARAMS}
    options = {}
    for key in ("temperature", "max_tokens"):
        if key in params:
            options[key] = params.pop(key)
    return options, params


async def ruler(
    message_lists: list[list[Any]],
    judge_model: str | None = None,
    extra_litellm_params: dict | None = None,
    rubric: str = DEFAULT_RUBRIC,
    *,
    debug: bool = False,
) -> list[TrajectoryScore]:
    """Score message lists (one per trajectory) relative to each other; one TrajectoryScore each, in order.

    judge_model: a model this batch may call; None: the batch's judge. extra_litellm_params: request
    settings for the judge (temperature, max_tokens, …); routing settings (api_base, api_key) are ignored.
    """
    if not message_lists:
        return []
    lists = [[message_dict(m) for m in messages] for messages in message_lists]
    options, extra_body = _request_options(extra_litellm_params)
    client = judge_client()
    # The judge's answers are no part of a rollout's conversation: a capture_auto_trajectory around this call
    # records none of them.
    outside_capture = auto_context.set(None)
    try:
        return await score_message_lists(
            client, judge_name(judge_model), lists, rubric=rubric, debug=debug, extra_body=extra_body or None, **options
        )
    finally:
        auto_context.reset(outside_capture)
        await client.close()


async def ruler_score_group(
    group: TrajectoryGroup,
    judge_model: str | None = None,
    extra_litellm_params: dict | None = None,
    rubric: str = DEFAULT_RUBRIC,
    *,
    swallow_exceptions: bool = False,
    debug: bool = False,
) -> TrajectoryGroup | None:
    """A new group whose trajectories carry the judge's scores as their rewards, as ART's does.

    Each copy keeps its former reward in metrics["independent_reward"], the score in
    metrics["ruler_score"], and the judge's reason in its logs and in metadata["ruler_explanation"]; the
    trajectories passed in are left unchanged. swallow_exceptions: on failure return None instead of
    raising.
    """
    trajectories = list(group)
    if any(t.additional_histories for t in trajectories):
        raise ValueError("RULER does not score trajectories with additional_histories.")
    copies = [
        Trajectory(
            messages_and_choices=list(t.messages_and_choices),
            tools=list(t.tools) if t.tools else t.tools,
            reward=t.reward,
            metrics=dict(t.metrics),
            metadata=dict(t.metadata),
            logs=list(t.logs),
            initial_policy_version=t.initial_policy_version,
            final_policy_version=t.final_policy_version,
            start_time=t.start_time,
            **t.extra,
        )
        for t in trajectories
    ]
    for copy in copies:
        copy.metrics["independent_reward"] = copy.reward
    try:
        scores = await ruler([t.messages() for t in copies], judge_model, extra_litellm_params, rubric, debug=debug)
    except Exception as exc:
        if not swallow_exceptions:
            raise
        print(f"[RULER] the group was not scored: {type(exc).__name__}: {exc}")
        return None
    for copy, score in zip(copies, scores, strict=False):
        copy.reward = score.score
        copy.metrics["ruler_score"] = score.score
        copy.metadata["ruler_explanation"] = score.explanation
        copy.log(f"RULER explanation: {score.explanation}")
    return TrajectoryGroup(
        copies,
        metadata=getattr(group, "metadata", None),
        metrics=getattr(group, "metrics", None),
        logs=getattr(group, "logs", None),
    )
