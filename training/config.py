"""RunConfig: everything a run is started with, validated with explicit bounds and stored whole.

Rollout-side settings live here; the optimisation settings are the engine's TrainConfig, nested under
`train` and validated by it. Errors name the field and the allowed range.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from artweb.api import MAX_INT
from artweb.errors import ApplicationError
from rollouts.sandbox.attachments import attachment_name_problem
from rollouts.sandbox.tools import MAX_HOSTS, host_entry_check, secret_name_problem
from training.engine.config import ConfigError, TrainConfig


class AlertRules(BaseModel):
    """When a run warns that it is not learning, or is learning the wrong thing. Each rule raises one alert
    per streak (an event and a banner on the run page, with example trajectories); a threshold of 0 turns
    its rule off. Editable while the run goes."""

    model_config = ConfigDict(extra="forbid")

    no_signal_steps: int = Field(
        3, ge=0, le=10_000, description="Steps in a row in which every group's rollouts got the same reward."
    )
    flat_reward_steps: int = Field(
        10, ge=0, le=10_000, description="Steps over which the train reward moved less than flat_reward_delta."
    )
    flat_reward_delta: float = Field(
        0.01,
        ge=0.0,
        le=1e9,
        description="How far the train reward must move (max - min of the step means) "
        "within flat_reward_steps not to count as flat.",
    )
    entropy_collapse: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="Share of the first step's token entropy below which the policy "
        "counts as collapsed (it samples nearly one answer).",
    )
    truncation_share: float = Field(
        0.5, ge=0.0, le=1.0, description="Share of a step's rollouts stopped by max_tokens above which the run warns."
    )
    heldout_divergence: int = Field(
        3,
        ge=0,
        le=1000,
        description="Validations in a row in which the train reward rose while the held-out "
        "reward fell: the policy fits the training scenarios, not the task.",
    )
    length_drift: float = Field(
        2.0,
        ge=0.0,
        le=1000.0,
        description="Factor by which the mean completion length may grow or shrink from "
        "the first steps' before the run warns (unless the held-out "
        "reward has improved meanwhile).",
    )
    component_share: float = Field(
        0.8,
        ge=0.0,
        le=1.0,
        description="Share of the total reward one component may carry; components are the "
        "trajectory metrics named in reward_components, or, when none are "
        "named, metrics that add up to the reward.",
    )
    reward_components: list[str] = Field(
        default_factory=list, max_length=50, description="Trajectory metrics that make up the reward."
    )
    repeated_answer_share: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Share of a step's scenarios in which one and the same final answer "
        "text appears, above which the run warns.",
    )
    pause_on_alert: bool = Field(False, description="Pause the run when an alert fires (resume from its page).")


MAX_ATTACHMENTS = 20  # data attachments one run may name


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    num_steps: int = Field(20, ge=1, le=100_000, description="Training steps to run.")
    group_size: int = Field(
        6, ge=2, le=64, description="Rollouts per scenario; GRPO compares them with each other (at least 2)."
    )
    scenarios_per_step: int = Field(4, ge=1, le=512, description="Training scenarios sampled per step.")
    max_tokens: int = Field(48, ge=1, le=32_768, description="Completion tokens per model call.")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature for rollouts.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    concurrency: int = Field(32, ge=1, le=1024, description="Rollouts in flight at once.")
    rollout_timeout_s: float = Field(120.0, gt=0, le=3600, description="Wall-clock limit per rollout, seconds.")
    max_exceptions: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Share of a step's rollouts that may fail before the step fails: 0 none, "
        "0.5 up to half, 1.0 any number (a step whose rollouts all failed "
        "still fails: there is nothing to train on).",
    )
    val_every: int = Field(5, ge=0, le=100_000, description="Validate every N steps (0: never).")
    val_scenarios: int = Field(8, ge=0, le=10_000, description="Held-out scenarios per validation.")
    use_ruler: bool = Field(
        False,
        description="Score each group with RULER: the judge (ruler_judge) compares the group's rollouts side by "
        "side and its scores become the rewards (a reward function's value is kept as the "
        "metric independent_reward).",
    )
    ruler_judge: str = Field(
        "",
        max_length=220,
        description="RULER's judge: empty for the run's own base model; model:<name> for another registered base "
        "model, which the worker serves beside the run's; endpoint:<name> for one of your judge "
        "endpoints (an OpenAI-compatible server elsewhere, set up on the Models page).",
    )
    overlap_rollouts: bool = Field(
        False,
        description="Roll out the next step while this one trains: faster steps on data one policy version "
        "old (policy_lag 1 in the step's metrics; sampler_kl shows the gap). Needs an inference server that "
        "serves several adapters at once (vLLM's runtime LoRA adapters, the GPU default); elsewhere steps "
        "run in order and the run's log says so.",
    )
    attachments: list[str] = Field(
        default_factory=list,
        max_length=MAX_ATTACHMENTS,
        description="Names of your data attachments the rollouts read, each at /data/<name> in the sandbox, read-only.",
    )
    seed: int = Field(0, ge=0, le=MAX_INT, description="Seed for scenario sampling and training.")
    keep_last_checkpoints: int = Field(2, ge=1, le=1000, description="Retention: newest checkpoints kept.")
    keep_best_checkpoints: int = Field(1, ge=0, le=1000, description="Retention: best by validation reward kept.")
    alerts: AlertRules = Field(default_factory=AlertRules, description="When the run warns (see AlertRules).")
    hosts: list[str] = Field(
        default_factory=list,
        max_length=MAX_HOSTS,
        description="Named hosts: HTTPS hosts the agent may reach (host or host:port, port 443 by default), e.g. a "
        "search API or an MCP server, through the worker's proxy (public addresses only). Only where the operator "
        "lets you (ARTWEB_NAMED_HOSTS).",
    )
    secrets: list[str] = Field(
        default_factory=list,
        max_length=50,
        description="Names of your secrets (the Secrets page) given to the run's code as environment variables.",
    )
    train: dict[str, Any] = Field(
        default_factory=dict,
        validate_default=True,
        description="Engine TrainConfig (learning rate, LoRA, loss…); defaults filled in.",
    )

    @field_validator("attachments")
    @classmethod
    def _check_attachments(cls, value: list[str]) -> list[str]:
        for name in value:
            if problem := attachment_name_problem(name):
                raise ValueError(problem)
        if len(set(value)) != len(value):
            raise ValueError("an attachment is named twice; list each once")
        return value

    @field_validator("ruler_judge")
    @classmethod
    def _check_judge(cls, value: str) -> str:
        value = value.strip()
        if value and not value.startswith(("model:", "endpoint:")):
            raise ValueError(
                f"{value!r} is not a judge: leave it empty for the run's base model, or write "
                "model:<registered model name> or endpoint:<your judge endpoint's name>"
            )
        return value

    @field_validator("hosts", "secrets", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        """A comma-separated string (the launch form's) as a list."""
        return [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value

    @field_validator("hosts")
    @classmethod
    def _check_hosts(cls, value: list[str]) -> list[str]:
        checked, problems = [], []
        for entry in value:
            try:
                checked.append(host_entry_check(entry, settings.ARTWEB_EGRESS))
            except ValueError as exc:
                problems.append(str(exc))
        if problems:
            raise ValueError("; ".join(problems))
        return list(dict.fromkeys(checked))

    @field_validator("secrets")
    @classmethod
    def _check_secrets(cls, value: list[str]) -> list[str]:
        problems = [p for name in value if (p := secret_name_problem(name)) is not None]
        if problems:
            raise ValueError("; ".join(problems))
        return list(dict.fromkeys(value))

    @field_validator("train")
    @classmethod
    def _check_train(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            train = TrainConfig.from_dict(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc
        if train.base_quantization == "4bit" and not settings.ARTWEB["DEVICE"].startswith("cuda"):
            raise ValueError(
                'base_quantization "4bit" needs a GPU worker (bitsandbytes on CUDA) and this artweb trains on the '
                'CPU: use "none".'
            )
        return train.to_dict()


def run_config_parse(data: dict[str, Any] | None) -> RunConfig:
    """Validate a config dict (missing keys take defaults); raise ApplicationError naming bad fields."""
    try:
        return RunConfig.model_validate(data or {})
    except ValidationError as exc:
        field_errors: dict[str, list[str]] = {}
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "config"
            field_errors.setdefault(field, []).append(_explain(err))
        summary = "; ".join(f"{f}: {msgs[0]}" for f, msgs in field_errors.items())
        raise ApplicationError(f"Invalid run config: {summary}", field_errors=field_errors) from exc


def _explain(err: dict) -> str:
    ctx = err.get("ctx") or {}
    if err["type"] == "extra_forbidden":
        return "unknown setting; remove it (see the run config reference for the allowed names)"
    if "ge" in ctx or "le" in ctx or "gt" in ctx or "lt" in ctx:
        return f"{err['msg']} (got {err.get('input')!r})"
    return err["msg"].removeprefix("Value error, ")
