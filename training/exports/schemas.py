"""Per-kind export settings: validated with explicit bounds, stored whole in ExportTarget.settings.

Nothing here is secret. The API key goes to ExportTarget.secret_encrypted. Only a staff member's target
(the operator's own) falls back to the worker's environment for what it leaves empty (WANDB_API_KEY,
WANDB_BASE_URL; LANGFUSE_SECRET_KEY / LANGFUSE_PUBLIC_KEY / LANGFUSE_HOST); see selectors.export_target_uses_worker_env.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from artweb.errors import ApplicationError

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
_NAME_HINT = "use letters, digits, '.', '_' and '-', starting with a letter or digit, e.g. my-agent"


def _http_url(value: str) -> str:
    value = value.strip().rstrip("/")
    if value and not value.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https://")
    return value


class WandbSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str = Field(
        ...,
        min_length=1,
        max_length=128,
        pattern=_NAME,
        description="W&B project.",
        json_schema_extra={"hint": _NAME_HINT},
    )
    entity: str = Field("", max_length=128, description="Team or user; empty: the key's default entity.")
    base_url: str = Field("", max_length=500, description="Self-hosted W&B server; empty: W&B cloud.")
    mode: Literal["online", "offline"] = Field(
        "online", description="offline: files under the data dir, for `wandb sync` later."
    )
    trajectories_per_step: int = Field(8, ge=0, le=256, description="Sample trajectories logged per step.")
    log_checkpoints: bool = Field(False, description="Log each step's LoRA checkpoint as a model artifact.")

    _url = field_validator("base_url")(classmethod(lambda cls, v: _http_url(v)))


class WeaveSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str = Field(
        ...,
        min_length=3,
        max_length=257,
        pattern=r"^[A-Za-z0-9_.\-]+/[A-Za-z0-9_.\-]+$",
        description="entity/project that rollout scripts' @weave.op calls are traced to.",
        json_schema_extra={"hint": "give entity/project, e.g. my-team/agents"},
    )
    base_url: str = Field("", max_length=500, description="Self-hosted W&B server; empty: W&B cloud.")

    _url = field_validator("base_url")(classmethod(lambda cls, v: _http_url(v)))


class LangfuseSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field("", max_length=500, description="Langfuse server; empty: Langfuse cloud.")
    public_key: str = Field("", max_length=200, description="Your Langfuse public key (pk-lf-…).")
    include_validation: bool = Field(True, description="Also export validation trajectories.")

    _url = field_validator("host")(classmethod(lambda cls, v: _http_url(v)))


SCHEMAS: dict[str, type[BaseModel]] = {"wandb": WandbSettings, "weave": WeaveSettings, "langfuse": LangfuseSettings}


def export_settings_parse(kind: str, data: dict | None) -> BaseModel:
    """Validate settings for kind; raise ApplicationError naming the bad fields and what to enter instead."""
    if kind not in SCHEMAS:
        raise ApplicationError(
            f"Unknown export kind {kind!r}; choose one of {', '.join(SCHEMAS)}.", field_errors={"kind": ["invalid"]}
        )
    schema = SCHEMAS[kind]
    try:
        return schema.model_validate(data or {})
    except ValidationError as exc:
        field_errors: dict[str, list[str]] = {}
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "settings"
            field_errors.setdefault(f"settings.{field}", []).append(_say(err, schema))
        first = next(iter(field_errors.items()))
        raise ApplicationError(f"Export settings: {first[0]}: {first[1][0]}", field_errors=field_errors) from exc


def _say(err: dict, schema: type[BaseModel]) -> str:
    """pydantic's message, turned into what to enter instead where pydantic's own would not say."""
    name = str(err["loc"][0]) if err["loc"] else ""
    info = schema.model_fields.get(name)
    hint = (info.json_schema_extra or {}).get("hint") if info and isinstance(info.json_schema_extra, dict) else None
    kind = err["type"]
    if kind == "missing":
        what = (info.description or "").rstrip(".") if info else ""
        return f"required: {what or 'enter a value'}" + (f" ({hint})" if hint else "")
    if kind == "extra_forbidden":
        return f"not a setting of this kind; the settings are {', '.join(schema.model_fields)}"
    message = err["msg"].removeprefix("Value error, ")
    if kind.startswith("string_pattern") and hint:
        return f"not valid: {hint}"
    if kind == "bool_parsing":
        return "give true or false"
    return f"{message} ({hint})" if hint else message
