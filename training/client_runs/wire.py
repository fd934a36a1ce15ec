"""What an ART client posts, checked and turned into what artweb stores and trains: no Django here.

A training job's body is ART's `TrajectoryGroup.model_dump(mode="json")` per group. A trajectory's
`messages_and_choices` mixes plain messages (prompts, tool results: never trained) with the OpenAI
`Choice` objects the policy returned (its samples: trained). A choice becomes an assistant message with
`sampled: true` and, when the client kept them, the sampler's token ids (`token_ids`, or `token_id:<n>`
tokens in its logprobs) and log-probs; a turn without them is completed on the worker (the chat template's
ids, the current policy's log-probs: training.engine.trainer.GRPOTrainer.complete_sampled_turns). A
trajectory's `additional_histories` are converted the same way, each into {"messages", "tools"}: trained,
as in ART, as sequences of their own with the trajectory's advantage.

Every error says which group and trajectory, and what to change. Anything artweb cannot honour is refused
by name, never ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rollouts.sandbox.records import RecordError, check_trajectory, record_size
from training.engine.config import ConfigError, TrainConfig

MAX_GROUPS = 1024
MAX_GROUP_SIZE = 256
NAME_CHARS = 100

GROUP_FIELDS = {"trajectories", "exceptions", "metadata", "metrics", "logs"}
TRAJECTORY_FIELDS = {
    "messages_and_choices",
    "tools",
    "additional_histories",
    "reward",
    "initial_policy_version",
    "final_policy_version",
    "metrics",
    "metadata",
    "logs",
}
JOB_FIELDS = {"model_id", "trajectory_groups", "experimental_config"}
EXPERIMENTAL_FIELDS = {
    "learning_rate",
    "ppo",
    "epsilon",
    "epsilon_high",
    "advantage_balance",
    "scale_rewards",
    "importance_sampling_level",
    "max_negative_advantage_importance_sampling_weight",
    "mask_prob_ratio",
    "kimi_k2_tau",
    "precalculate_logprobs",
}


class WireError(ValueError):
    """A posted body artweb refuses; the message says where and what to change (an HTTP 400)."""

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass
class ParsedGroup:
    scenario: dict  # what the heatmap groups by: the group's metadata, its trajectories' shared one, or its index
    trajectories: list[dict]


@dataclass
class ParsedJob:
    model_id: str
    groups: list[ParsedGroup]
    settings: dict[str, Any]
    tokens: dict[str, int] = field(default_factory=dict)
    size_bytes: int = 0


# --- models --------------------------------------------------------------------------------------------


def parse_model_create(body: Any) -> dict:
    """`POST /preview/models`: {entity|null, project, name, base_model, return_existing}."""
    if not isinstance(body, dict):
        raise WireError("The body must be a JSON object: {project, name, base_model, entity?, return_existing?}.")
    out = {}
    for key in ("project", "name", "base_model"):
        value = body.get(key)
        if not isinstance(value, str) or not value.strip():
            raise WireError(f"'{key}' is required: a non-empty string.", param=key)
        out[key] = value.strip()
    for key in ("project", "name"):
        if len(out[key]) > NAME_CHARS or "/" in out[key] or ":" in out[key] or "@" in out[key]:
            raise WireError(
                f"'{key}' must be at most {NAME_CHARS} characters without '/', ':' or '@' (got {out[key][:120]!r}).",
                param=key,
            )
    entity = body.get("entity")
    if entity is not None and (not isinstance(entity, str) or not entity.strip() or len(entity) > NAME_CHARS):
        raise WireError(f"'entity' must be null or a name of at most {NAME_CHARS} characters.", param="entity")
    if isinstance(entity, str) and ("/" in entity or ":" in entity):
        raise WireError("'entity' must not contain '/' or ':'.", param="entity")
    out["entity"] = entity.strip() if entity else None
    out["return_existing"] = bool(body.get("return_existing", False))
    return out


# --- training jobs -------------------------------------------------------------------------------------


def parse_training_job(body: Any, *, vocab_size: int | None, record_bytes: int) -> ParsedJob:
    """`POST /preview/training-jobs`, checked group by group and trajectory by trajectory."""
    if not isinstance(body, dict):
        raise WireError("The body must be a JSON object: {model_id, trajectory_groups, experimental_config}.")
    _no_unknown(body, JOB_FIELDS, "The training job")
    model_id = body.get("model_id")
    if not isinstance(model_id, str) or not model_id:
        raise WireError("'model_id' is required: the id register() returned.", param="model_id")
    raw_groups = body.get("trajectory_groups")
    if not isinstance(raw_groups, list) or not raw_groups:
        raise WireError("'trajectory_groups' must be a non-empty list of groups.", param="trajectory_groups")
    if len(raw_groups) > MAX_GROUPS:
        raise WireError(
            f"A training job takes at most {MAX_GROUPS} groups, got {len(raw_groups)}; train in smaller batches.",
            param="trajectory_groups",
        )
    settings, recompute = train_settings(body.get("experimental_config"))
    tokens = {"client_turns_sampled": 0, "client_turns_retokenized": 0, "client_turns_policy_logprobs": 0}
    groups = [_group(g, i, vocab_size, record_bytes, tokens, recompute) for i, g in enumerate(raw_groups)]
    if not any(m.get("sampled") for g in groups for t in g.trajectories for m in _all_messages(t)):
        raise WireError(
            "No trajectory holds a completion the model sampled, so there is nothing to train: keep the Choice "
            "objects that model.openai_client() returned in messages_and_choices, not plain message dicts."
        )
    if all(len({t["reward"] for t in g.trajectories if t["reward"] is not None}) < 2 for g in groups):
        raise WireError(
            "Every group's trajectories have the same reward, so GRPO has nothing to compare and nothing would "
            "be trained; make the reward tell the trajectories apart, or post groups whose rewards differ."
        )
    size = sum(record_size(t) for g in groups for t in g.trajectories)
    return ParsedJob(model_id=model_id, groups=groups, settings=settings, tokens=tokens, size_bytes=size)


def train_settings(config: Any) -> tuple[dict[str, Any], bool]:
    """ART's experimental_config → TrainConfig keys for the step, and whether to recompute log-probs."""
    if config is None:
        return {}, False
    if not isinstance(config, dict):
        raise WireError("'experimental_config' must be an object or null.", param="experimental_config")
    _no_unknown(config, EXPERIMENTAL_FIELDS, "experimental_config")
    unsupported = {
        "advantage_balance": lambda v: v in (None, 0, 0.0),
        "importance_sampling_level": lambda v: v in (None, "token"),
        "max_negative_advantage_importance_sampling_weight": lambda v: v is None,
        "mask_prob_ratio": lambda v: v in (None, False),
        "kimi_k2_tau": lambda v: v is None,
    }
    for key, fine in unsupported.items():
        if not fine(config.get(key)):
            raise WireError(
                f"experimental_config.{key}={config[key]!r} is not supported by artweb's trainer; leave it at "
                "ART's default (advantage_balance 0, importance_sampling_level 'token', the others unset).",
                param=f"experimental_config.{key}",
            )
    settings: dict[str, Any] = {}
    if config.get("ppo") is not None:
        settings["loss"] = "ppo" if config["ppo"] else "cispo"  # ART's loss without ppo is CISPO's clipping
    for key in ("learning_rate", "epsilon", "epsilon_high", "scale_rewards"):
        if config.get(key) is not None:
            settings[key] = config[key]
    try:
        TrainConfig.from_dict(settings)
    except ConfigError as exc:
        raise WireError(f"experimental_config: {exc}", param="experimental_config") from None
    return settings, bool(config.get("precalculate_logprobs"))


def _group(raw: Any, g: int, vocab_size, record_bytes: int, tokens: dict, recompute: bool) -> ParsedGroup:
    where = f"group {g}"
    if not isinstance(raw, dict):
        raise WireError(f"{where} is not an object (a TrajectoryGroup as JSON).")
    _no_unknown(raw, GROUP_FIELDS, where)
    trajs = raw.get("trajectories")
    if not isinstance(trajs, list) or len(trajs) < 2:
        got = len(trajs) if isinstance(trajs, list) else "no list of"
        raise WireError(
            f"{where} has {got} trajectories; GRPO compares the trajectories of a group with each other, so a "
            "group needs at least two (roll out the scenario several times)."
        )
    if len(trajs) > MAX_GROUP_SIZE:
        raise WireError(f"{where} has {len(trajs)} trajectories; at most {MAX_GROUP_SIZE} are allowed.")
    metadata = _scalars(raw.get("metadata"), f"{where}: metadata")
    _numbers(raw.get("metrics"), f"{where}: metrics")
    records = [
        _trajectory(t, f"{where}, trajectory {i}", vocab_size, record_bytes, tokens, recompute)
        for i, t in enumerate(trajs)
    ]
    for k, exc in enumerate(raw.get("exceptions") or []):
        records.append(_exception_record(exc, f"{where}, exception {k}"))
    shared = [r["metadata"] for r in records[: len(trajs)]]
    scenario = metadata or (shared[0] if shared[0] and all(m == shared[0] for m in shared) else {"group": g})
    return ParsedGroup(scenario=scenario, trajectories=records)


def _trajectory(raw: Any, where: str, vocab_size, record_bytes: int, tokens: dict, recompute: bool) -> dict:
    if not isinstance(raw, dict):
        raise WireError(f"{where} is not an object (a Trajectory as JSON).")
    _no_unknown(raw, TRAJECTORY_FIELDS, where)
    reward = raw.get("reward", 0.0)
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise WireError(f"{where}: reward must be a finite number, got {reward!r:.60}.")
    messages = _messages(raw.get("messages_and_choices"), where, vocab_size, tokens, recompute)
    histories = raw.get("additional_histories") or []
    if not isinstance(histories, list):
        raise WireError(f"{where}: additional_histories must be a list of History objects.")
    histories = [
        _history(h, f"{where}, additional history {k}", vocab_size, tokens, recompute) for k, h in enumerate(histories)
    ]
    metrics = _numbers(raw.get("metrics"), f"{where}: metrics")
    duration = metrics.get("duration")
    sampled = [m for m in [*messages, *(m for h in histories for m in h["messages"])] if m.get("sampled")]
    record = {
        "messages": messages,
        "tools": raw.get("tools"),
        "reward": float(reward),
        "metrics": metrics,
        "metadata": _scalars(raw.get("metadata"), f"{where}: metadata"),
        "logs": raw.get("logs") or [],
        "error": "",
        "prompt_tokens": 0,
        "completion_tokens": sum(len(m.get("token_ids") or m.get("sampled_token_ids") or []) for m in sampled),
        "duration_ms": int(duration * 1000) if isinstance(duration, (int, float)) and 0 <= duration < 1e7 else 0,
    }
    if histories:
        record["additional_histories"] = histories
    try:
        record = check_trajectory(record, vocab_size=vocab_size)
    except RecordError as exc:
        raise WireError(f"{where}: {exc}.") from None
    if record_size(record) > record_bytes:
        raise WireError(f"{where} is larger than {record_bytes >> 20} MB as JSON, the limit for one trajectory.")
    return record


def _messages(items: Any, where: str, vocab_size, tokens: dict, recompute: bool) -> list[dict]:
    if not isinstance(items, list):
        raise WireError(f"{where}: messages_and_choices must be a list.")
    return [_item(item, f"{where}, item {i}", vocab_size, tokens, recompute) for i, item in enumerate(items)]


def _history(raw: Any, where: str, vocab_size, tokens: dict, recompute: bool) -> dict:
    """An ART History ({messages_and_choices, tools}) as a record's additional history: {messages, tools}."""
    if not isinstance(raw, dict):
        raise WireError(f"{where} is not an object (a History as JSON: messages_and_choices and tools).")
    _no_unknown(raw, {"messages_and_choices", "tools"}, where)
    return {
        "messages": _messages(raw.get("messages_and_choices"), where, vocab_size, tokens, recompute),
        "tools": raw.get("tools"),
    }


def _all_messages(record: dict) -> list[dict]:
    return [*record["messages"], *(m for h in record.get("additional_histories") or [] for m in h["messages"])]


def _item(item: Any, where: str, vocab_size, tokens: dict, recompute: bool) -> dict:
    """A plain message as it is (never trained: its token ids, if any, are dropped), or a Choice as the
    sampled assistant turn it is."""
    if not isinstance(item, dict):
        raise WireError(f"{where} is neither a message nor a Choice object.")
    if "message" not in item or "role" in item:
        if not isinstance(item.get("role"), str):
            raise WireError(f"{where} is a message without a string 'role'.")
        return {k: v for k, v in item.items() if k not in ("token_ids", "logprobs", "sampled")}
    message = item.get("message")
    if not isinstance(message, dict):
        raise WireError(f"{where} is a Choice whose 'message' is not an object.")
    # Checked here, not left to fail the step: the chat template renders them.
    if message.get("content") is not None and not isinstance(message["content"], str):
        raise WireError(f"{where} is a Choice whose message content is neither a string nor null.")
    calls = message.get("tool_calls")
    if calls is not None and not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
        raise WireError(f"{where} is a Choice whose message tool_calls is not a list of objects.")
    turn = {"role": "assistant", "content": message.get("content"), "sampled": True}
    if message.get("tool_calls"):
        turn["tool_calls"] = message["tool_calls"]
    if item.get("finish_reason") is not None:
        turn["finish_reason"] = item["finish_reason"]
    ids, logprobs = _sampled_tokens(item, vocab_size)
    if ids is None:
        tokens["client_turns_retokenized"] += 1
        logprobs = None
    else:
        turn["token_ids"] = ids
        tokens["client_turns_sampled"] += 1
    if recompute or logprobs is None:
        tokens["client_turns_policy_logprobs"] += 1
        logprobs = None
    if ids is not None and logprobs is not None:
        turn["logprobs"] = logprobs
    elif ids is not None:  # the sampler's ids without their log-probs: the worker adds the policy's
        turn["sampled_token_ids"] = turn.pop("token_ids")
    return turn


def _sampled_tokens(choice: dict, vocab_size: int | None) -> tuple[list[int] | None, list[float] | None]:
    """The sampler's token ids and log-probs a Choice carries: ids from `token_ids` (vLLM's
    return_token_ids) or from `token_id:<n>` tokens; None for what is missing, malformed or not this
    model's (an id past its vocabulary)."""
    entries = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
    logprobs = None
    if isinstance(entries, list) and entries:
        values = [e.get("logprob") if isinstance(e, dict) else None for e in entries]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v <= 0 for v in values):
            logprobs = [float(v) for v in values]
    ids = choice.get("token_ids")
    if ids is None and isinstance(entries, list) and entries:
        tokens = [e.get("token") if isinstance(e, dict) else None for e in entries]
        if all(isinstance(t, str) and t.startswith("token_id:") and t[9:].isdigit() for t in tokens):
            ids = [int(t[9:]) for t in tokens]
    if not isinstance(ids, list) or not ids:
        return None, None
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < (vocab_size or 2**31) for t in ids):
        return None, None
    if logprobs is not None and len(logprobs) != len(ids):
        logprobs = None
    return ids, logprobs


def _exception_record(raw: Any, where: str) -> dict:
    """A rollout the client's gather caught failing: kept to inspect as an errored trajectory, never trained."""
    if not isinstance(raw, dict):
        raise WireError(f"{where} is not an object with type, message and traceback.")
    text = "\n".join(str(raw.get(k) or "") for k in ("type", "message", "traceback")).strip()
    return {
        "messages": [],
        "tools": None,
        "reward": None,
        "metrics": {},
        "metadata": {},
        "logs": [],
        "error": text[:20_000] or "the client's rollout raised",
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "duration_ms": 0,
    }


def _no_unknown(obj: dict, known: set[str], where: str) -> None:
    unknown = sorted(set(obj) - known)
    if unknown:
        raise WireError(
            f"{where} has fields artweb does not know: {', '.join(unknown)}; it accepts {', '.join(sorted(known))}."
        )


def _scalars(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        v is None or isinstance(v, (str, bool, int)) or (isinstance(v, float) and math.isfinite(v))
        for v in value.values()
    ):
        raise WireError(f"{where} must be an object of strings, numbers, booleans or nulls.")
    return value


def _numbers(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(v, (bool, int)) or (isinstance(v, float) and math.isfinite(v)) for v in value.values()
    ):
        raise WireError(f"{where} must be an object of finite numbers or booleans.")
    return value
