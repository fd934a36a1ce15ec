"""Playground sessions and answer diffs: answers generated through the serving workers
(training.serving.services.serving), scored by a reward function of the user's in the jail (run_scores, as
re-scoring does), stored on a ServeJob. Both run on the default queue (serve_job_execute_task).

- Playground: one prompt (or one scenario of a set), up to four models, `samples` answers each, with
  token log-probs and tool calls kept for the page.
- Answer diff: every held-out scenario of a set (up to `max_scenarios`), `samples` answers on model A and
  on model B, each side's mean reward, and the change B - A per scenario.

A scenario becomes a conversation by its `messages` (a list of chat messages) or its `prompt` (one user
message, after the optional system message); any other scenario is sent as its JSON text. The answers
come from the model alone, not from a rollout script: what is compared is the checkpoints.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math

from django.db import transaction

from artweb.api import MAX_INT
from artweb.errors import ApplicationError
from artweb.visibility import may_see, require_visible
from rollouts.models import RewardFunctionVersion, Scenario, ScenarioSet
from rollouts.sandbox.batch import SandboxLimits
from rollouts.sandbox.scores import ScoreGroup, ScoreRequest, run_scores
from training import task_names
from training.jobs.kinds import JobKind
from training.jobs.leases import JobHeartbeat, worker_name
from training.jobs.services import job_claim, job_enqueue, job_event, job_fail, job_finish
from training.services import inference
from training.serving.models import DiffScenario, ServeJob
from training.serving.protocol import ServeError
from training.serving.selectors import diff_scenarios, diff_summary, serve_model_resolve
from training.serving.services.serving import serve_generate

logger = logging.getLogger(__name__)

MAX_MODELS = 4
MAX_SAMPLES = 8
MAX_DIFF_SCENARIOS = 200
MAX_TOKENS = 1024
TOP_LOGPROBS = 3
SCORE_BATCH = 16  # scenarios scored per jailed batch
TOOL_CHOICES = ("auto", "required", "none")


def _bounded(value, name: str, lo, hi, kind=int):
    try:
        v = kind(value)
    except (TypeError, ValueError):
        raise ApplicationError(
            f"{name} must be a number from {lo} to {hi}.", field_errors={name: [f"from {lo} to {hi}"]}
        ) from None
    if isinstance(value, bool) or not lo <= v <= hi or (kind is float and not math.isfinite(v)):
        raise ApplicationError(
            f"{name} must be from {lo} to {hi}, not {value}.", field_errors={name: [f"from {lo} to {hi}"]}
        )
    return v


def _reward_for(user, reward_version: RewardFunctionVersion | None) -> RewardFunctionVersion | None:
    if reward_version is not None and not may_see(user, reward_version, owner_field="asset__owner"):
        raise ApplicationError(
            "That reward function is not yours; choose one of your own.", field_errors={"reward_version": ["not found"]}
        )
    return reward_version


def _models_check(user, names) -> list[str]:
    names = [str(n).strip() for n in names or [] if str(n).strip()]
    if not 1 <= len(names) <= MAX_MODELS:
        raise ApplicationError(
            f"Choose 1 to {MAX_MODELS} models.", field_errors={"models": [f"1 to {MAX_MODELS} model names"]}
        )
    for name in names:
        try:
            serve_model_resolve(user=user, name=name)
        except ServeError as exc:
            raise ApplicationError(exc.message, field_errors={"models": [f"{name}: not found"]}) from None
    return names


def _sampling(samples, temperature, max_tokens) -> dict:
    out = {
        "samples": _bounded(samples, "samples", 1, MAX_SAMPLES),
        "temperature": _bounded(temperature, "temperature", 0.0, 2.0, float),
        "max_tokens": _bounded(max_tokens, "max_tokens", 1, MAX_TOKENS),
    }
    if out["temperature"] == 0 and out["samples"] > 1:
        raise ApplicationError(
            "At temperature 0 every sample is the same answer: ask for 1 sample, or raise the temperature.",
            field_errors={"samples": ["1 at temperature 0"]},
        )
    return out


# A running serve job is claimable too: one whose worker is gone is taken over (serve_job_execute).
SERVE_JOBS = JobKind(
    name="serve_jobs",
    model=ServeJob,
    task=task_names.SERVE_JOB_EXECUTE,
    claimable=(ServeJob.Status.QUEUED, ServeJob.Status.RUNNING),
)


def _enqueue(job: ServeJob, *, user) -> None:
    """Queue the job: its event, and its message after commit (owed, and sent by the sweep, while the
    broker cannot take it)."""
    job_event(jobs=SERVE_JOBS, job=job, kind="created", message=f"{job.get_kind_display()} queued.", actor=user)
    job_enqueue(jobs=SERVE_JOBS, job=job)


@transaction.atomic
def playground_create(
    *,
    user,
    models: list[str],
    prompt: str = "",
    system: str = "",
    scenario: Scenario | None = None,
    tools: list | None = None,
    tool_choice: str = "auto",
    reward_version: RewardFunctionVersion | None = None,
    samples: int = 2,
    temperature: float = 1.0,
    max_tokens: int = 128,
) -> ServeJob:
    """Queue one playground session: `prompt` (or `scenario`) answered by each of `models`."""
    names = _models_check(user, models)
    if scenario is not None:
        require_visible(user, scenario, what="scenario", field="scenario", owner_field="scenario_set__owner")
    if scenario is None and not (prompt or "").strip():
        raise ApplicationError("Write a prompt, or pick a scenario.", field_errors={"prompt": ["required"]})
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise ApplicationError(
            "tools must be a JSON list of OpenAI tool definitions.", field_errors={"tools": ["a list of objects"]}
        )
    tool_names = [((t.get("function") or {}).get("name")) for t in tools or []]
    if tool_choice not in TOOL_CHOICES and tool_choice not in tool_names:
        raise ApplicationError(
            f"tool_choice must be one of {', '.join(TOOL_CHOICES)}, or the name of one of the tools.",
            field_errors={"tool_choice": ["auto, required, none or a tool's name"]},
        )
    job = ServeJob.objects.create(
        owner=user,
        kind=ServeJob.Kind.PLAYGROUND,
        model_names=names,
        scenario_set=scenario.scenario_set if scenario else None,
        reward_version=_reward_for(user, reward_version),
        params={
            "prompt": (prompt or "").strip(),
            "system": (system or "").strip(),
            "scenario": scenario.id if scenario else None,
            # As text: PostgreSQL's jsonb reorders an object's keys, and the tools are rendered into the prompt
            # as written (a small model called the tool or not depending on the order of its schema's keys).
            "tools": json.dumps(tools) if tools else None,
            "tool_choice": tool_choice,
            **_sampling(samples, temperature, max_tokens),
        },
        progress_total=len(names),
    )
    _enqueue(job, user=user)
    return job


@transaction.atomic
def diff_create(
    *,
    user,
    model_a: str,
    model_b: str,
    scenario_set: ScenarioSet,
    reward_version: RewardFunctionVersion,
    samples: int = 4,
    temperature: float = 1.0,
    max_tokens: int = 128,
    max_scenarios: int = 50,
    system: str = "",
    seed: int = 0,
) -> ServeJob:
    """Queue an answer diff of model_a against model_b over the set's held-out scenarios."""
    names = _models_check(user, [model_a, model_b])
    if len(names) != 2:
        raise ApplicationError("Name two models: model_a and model_b.", field_errors={"model_b": ["required"]})
    require_visible(user, scenario_set, what="scenario set", field="scenario_set")
    if reward_version is None:
        raise ApplicationError(
            "Choose the reward function that scores the answers.", field_errors={"reward": ["required"]}
        )
    count = min(
        _bounded(max_scenarios, "max_scenarios", 1, MAX_DIFF_SCENARIOS),
        scenario_set.scenarios.filter(split=Scenario.Split.VALIDATION).count(),
    )
    if count == 0:
        raise ApplicationError(
            f"Scenario set {scenario_set.name!r} has no held-out scenarios; upload it with a validation fraction.",
            field_errors={"scenario_set": ["no held-out scenarios"]},
        )
    job = ServeJob.objects.create(
        owner=user,
        kind=ServeJob.Kind.DIFF,
        model_names=names,
        scenario_set=scenario_set,
        reward_version=_reward_for(user, reward_version),
        params={
            "system": (system or "").strip(),
            "max_scenarios": count,
            "seed": _bounded(seed, "seed", 0, MAX_INT),
            **_sampling(samples, temperature, max_tokens),
        },
        progress_total=count,
    )
    _enqueue(job, user=user)
    return job


# --- execute -------------------------------------------------------------------------------------------


def scenario_messages(data, system: str = "") -> list[dict]:
    """The conversation a scenario asks for (see the module docstring)."""
    head = [{"role": "system", "content": system}] if system else []
    if isinstance(data, dict) and isinstance(data.get("messages"), list) and data["messages"]:
        return head + [m for m in data["messages"] if isinstance(m, dict)]
    if isinstance(data, dict) and isinstance(data.get("prompt"), str):
        return head + [{"role": "user", "content": data["prompt"]}]
    return head + [{"role": "user", "content": json.dumps(data, ensure_ascii=False)}]


def _generate(
    *, user, model: str, messages: list[dict], params: dict, tools=None, seed: int | None = None
) -> list[dict]:
    """`samples` answers of one model: content, tool calls, finish reason, token log-probs."""
    target = serve_model_resolve(user=user, name=model)
    body = {
        "model": model,
        "messages": messages,
        "n": params["samples"],
        "temperature": params["temperature"],
        "max_tokens": params["max_tokens"],
        "logprobs": True,
        "top_logprobs": TOP_LOGPROBS,
    }
    if tools:
        body["tools"] = tools
        choice = params.get("tool_choice") or "auto"
        body["tool_choice"] = choice if choice in TOOL_CHOICES else {"type": "function", "function": {"name": choice}}
    if seed is not None:
        body["seed"] = seed
    answer = serve_generate(target=target, body=body)
    out = []
    for choice in sorted(answer.get("choices") or [], key=lambda c: c.get("index", 0)):
        message = choice.get("message") or {}
        content = message.get("content") or ""
        tokens = [
            {
                "token": t.get("token"),
                "logprob": t.get("logprob"),
                "top": [[a.get("token"), a.get("logprob")] for a in t.get("top_logprobs") or []],
            }
            for t in ((choice.get("logprobs") or {}).get("content")) or []
        ]
        out.append(
            {
                "content": content,
                "tool_calls": message.get("tool_calls") or [],
                "finish_reason": choice.get("finish_reason"),
                "tokens": answer_tokens(tokens, content=content, finish_reason=choice.get("finish_reason")),
            }
        )
    return out


def answer_tokens(tokens: list[dict], *, content: str, finish_reason: str | None) -> list[dict]:
    """The answer's tokens as its text reads, without the end-of-turn token the model stopped on.

    The inference servers (vLLM, and the CTranslate2 server after it) list every generated token with its
    log-prob, the end-of-turn token included (`<|im_end|>` for ChatML models) when the answer stopped on
    it, while the answer's text leaves special tokens out: the page, which prints the tokens, would show
    it as a word of the answer. A last token that the text does not end with is that token (or the stop
    string the text was cut before); any other answer keeps all its tokens.
    """
    if finish_reason != "stop" or not tokens:
        return tokens
    last = tokens[-1].get("token") or ""
    return tokens[:-1] if last and not content.endswith(last) else tokens


def _assistant(answer: dict) -> dict:
    message = {"role": "assistant", "content": answer["content"]}
    if answer["tool_calls"]:
        message["tool_calls"] = answer["tool_calls"]
    return message


def _score(job: ServeJob, items: list[tuple[dict, list[dict], list[dict], list | None]]) -> None:
    """Score answers in place (reward, reward_error, metrics): items are (scenario, messages, answers, tools),
    one group each, all in one jailed batch. Nothing is scored without a reward function."""
    if job.reward_version is None or not items:
        return
    request = ScoreRequest(
        groups=[
            ScoreGroup(
                scenario=scenario if isinstance(scenario, dict) else {"value": scenario},
                trajectories=[
                    {"messages": messages + [_assistant(a)], "tools": tools, "metrics": {}, "metadata": {}}
                    for a in answers
                ],
            )
            for scenario, messages, answers, tools in items
        ],
        reward=job.reward_version.content,
        limits=SandboxLimits(rollout_timeout_s=30.0),
        jail=inference.jail_config(),
    )
    for (_, _, answers, _), scores in zip(items, run_scores(request), strict=True):
        for answer, score in zip(answers, scores, strict=True):
            answer["reward"] = score["reward"]
            answer["reward_error"] = score["error"] or ""
            answer["metrics"] = score["metrics"]


def _mean(answers: list[dict]) -> float | None:
    rewards = [a["reward"] for a in answers if a.get("reward") is not None]
    return sum(rewards) / len(rewards) if rewards else None


def serve_job_execute(*, job_id: int) -> None:
    """Claim a queued job and do it. A running one whose worker is gone (a redelivery, or the sweep's
    requeue) is taken over: a diff goes on from the scenarios it stored, a playground session starts
    again. A done or failed one, or one a live worker holds, is left alone."""
    me = worker_name()
    if not job_claim(jobs=SERVE_JOBS, job_id=job_id, me=me):
        return
    job = ServeJob.objects.select_related("owner", "reward_version", "scenario_set").get(id=job_id)
    try:
        with JobHeartbeat(SERVE_JOBS, job.id, me):
            result = _playground(job) if job.kind == ServeJob.Kind.PLAYGROUND else _diff(job)
        job_finish(jobs=SERVE_JOBS, job=job, result=result)
    except Exception as exc:
        logger.exception("serve job %s failed", job_id)
        job_fail(
            jobs=SERVE_JOBS,
            job=job,
            error=exc.message if isinstance(exc, ServeError) else f"{type(exc).__name__}: {exc}",
        )


def _tools(params: dict) -> list | None:
    tools = params.get("tools")
    return json.loads(tools) if isinstance(tools, str) else tools


def _playground(job: ServeJob) -> dict:
    params = job.params
    scenario = Scenario.objects.filter(id=params.get("scenario")).first() if params.get("scenario") else None
    data = scenario.data if scenario else {"prompt": params["prompt"]}
    messages = scenario_messages(data, params.get("system", ""))
    columns = []
    for k, name in enumerate(job.model_names):
        try:
            answers = _generate(user=job.owner, model=name, messages=messages, params=params, tools=_tools(params))
            columns.append({"model": name, "answers": answers, "error": ""})
        except ServeError as exc:
            columns.append({"model": name, "answers": [], "error": exc.message})
        ServeJob.objects.filter(id=job.id).update(progress_done=k + 1)
    _score(job, [(data, messages, c["answers"], _tools(params)) for c in columns if c["answers"]])
    for c in columns:
        c["mean_reward"] = _mean(c["answers"])
    return {"messages": messages, "scenario": data, "columns": columns}


def _diff(job: ServeJob) -> dict:
    params = job.params
    scenarios = list(
        Scenario.objects.filter(scenario_set=job.scenario_set, split=Scenario.Split.VALIDATION).order_by("index")[
            : params["max_scenarios"]
        ]
    )
    done = set(DiffScenario.objects.filter(job=job).values_list("scenario_id", flat=True))
    todo = [s for s in scenarios if s.id not in done]
    model_a, model_b = job.model_names
    for start in range(0, len(todo), SCORE_BATCH):
        chunk = todo[start : start + SCORE_BATCH]
        conversations = [scenario_messages(sc.data, params.get("system", "")) for sc in chunk]
        # One side after the other: on the CPU build each switch of model reloads the server's weights.
        # The same seed on both sides of a scenario: a change is the checkpoint's, not the dice's.
        answers = {
            model: [
                _generate(user=job.owner, model=model, messages=m, params=params, seed=params["seed"] + sc.index)
                for sc, m in zip(chunk, conversations, strict=True)
            ]
            for model in (model_a, model_b)
        }
        rows, items = [], []
        for sc, messages, a, b in zip(chunk, conversations, answers[model_a], answers[model_b], strict=True):
            items += [(sc.data, messages, a, None), (sc.data, messages, b, None)]
            rows.append((sc, a, b))
        _score(job, items)
        objs = []
        for sc, a, b in rows:
            ra, rb = _mean(a), _mean(b)
            for side in (a, b):
                for answer in side:
                    answer.pop("tokens", None)  # a diff shows the answers, not their tokens
            objs.append(
                DiffScenario(
                    job=job,
                    scenario=sc,
                    index=sc.index,
                    reward_a=ra,
                    reward_b=rb,
                    delta=None if ra is None or rb is None else rb - ra,
                    answers_a=a,
                    answers_b=b,
                )
            )
        DiffScenario.objects.bulk_create(objs, ignore_conflicts=True)
        ServeJob.objects.filter(id=job.id).update(progress_done=DiffScenario.objects.filter(job=job).count())
    return diff_summary(job=job)


def diff_row(row: DiffScenario) -> dict:
    return {
        "scenario": row.scenario_id,
        "index": row.index,
        "reward_a": row.reward_a,
        "reward_b": row.reward_b,
        "delta": row.delta,
        "answers_a": row.answers_a,
        "answers_b": row.answers_b,
    }


def diff_export_csv(*, job: ServeJob) -> str:
    """One line per scenario, biggest change first: rewards, change, and each side's first answer."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["index", "scenario", "reward_a", "reward_b", "delta", "answer_a", "answer_b"])
    for row in diff_scenarios(job=job):
        first = lambda answers: answers[0]["content"] if answers else ""  # noqa: E731
        writer.writerow(
            [
                row.index,
                row.scenario_id,
                row.reward_a,
                row.reward_b,
                row.delta,
                first(row.answers_a),
                first(row.answers_b),
            ]
        )
    return out.getvalue()
