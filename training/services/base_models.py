from __future__ import annotations

import re
from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from artweb.errors import ApplicationError
from artweb.visibility import may_see
from training.engine.config import ConfigError, TrainConfig
from training.models import PretrainedModel
from training.services import inference
from training.services.model_files import is_server_path, model_files_check

# A Hugging Face repository id: "name" or "org/name", letters, digits, '.', '_' and '-'.
HF_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")


def _check_source(*, source: str, owner: AbstractBaseUser | None, local_path: str) -> None:
    """A directory on the server is the operators' business: registering one makes the workers read the
    files there. Staff and the operator's own commands (owner None) may; everyone else gives a Hub id."""
    trusted = owner is None or owner.is_staff
    if is_server_path(source) or local_path:
        if not trusted:
            raise ApplicationError(
                "Only staff may register a model from a directory on the server; give a Hugging Face model id "
                "(org/name), or ask an administrator to register the directory.",
                field_errors={"source": ["server paths need staff"]},
            )
        return
    if trusted:
        return
    if not HF_ID.fullmatch(source) or ".." in source:
        raise ApplicationError(
            f"{source!r} is not a Hugging Face model id; give one as org/name, e.g. Qwen/Qwen2.5-0.5B-Instruct.",
            field_errors={"source": ["not a Hugging Face model id"]},
        )
    # The loaders try a local directory of that name before the Hub: "data/models" would read the server.
    if Path(source).exists():
        raise ApplicationError(
            f"{source!r} also names a directory on the server, so it cannot be registered "
            "as a Hub id; ask an administrator to register it.",
            field_errors={"source": ["names a server directory"]},
        )


def _visible(model: PretrainedModel, owner: AbstractBaseUser | None) -> bool:
    """Whether whoever registers sees the model: the operator's commands (owner None) see every one."""
    return owner is None or may_see(owner, model)


def recommended_train_check(value) -> dict:
    """A model's recommended training settings: a JSON object of TrainConfig keys, each within its bounds.
    Only the keys given are kept; the rest stay artweb's defaults."""
    if value in (None, ""):
        return {}
    if not isinstance(value, dict):
        raise ApplicationError(
            'Recommended settings must be a JSON object, e.g. {"learning_rate": 0.0002}.',
            field_errors={"recommended_train": ["not a JSON object"]},
        )
    try:
        TrainConfig.from_dict(value)
    except ConfigError as exc:
        raise ApplicationError(f"Recommended settings: {exc}", field_errors={"recommended_train": [str(exc)]}) from exc
    return dict(value)


def base_model_recommend(*, model: PretrainedModel, train: dict) -> PretrainedModel:
    """Replace the model's recommended training settings (runs already created keep theirs)."""
    model.recommended_train = recommended_train_check(train)
    model.save(update_fields=["recommended_train"])
    return model


def base_model_check(
    *, name: str, source: str, local_path: str = "", max_length: int = 2048, actor: AbstractBaseUser | None
) -> tuple[str, str, str]:
    """The rules of a base model's name and source, for whoever registers or edits one (the API, the
    models page, the admin): returns (name, source, local_path) stripped, or raises ApplicationError.
    actor: the person acting (None: the operator's own commands); a server directory needs staff.
    The model's files are checked as a worker will load them (training.services.model_files)."""
    name, source, local_path = _check_fields(
        name=name, source=source, local_path=local_path, max_length=max_length, actor=actor
    )
    _check_files(source=source, local_path=local_path)
    return name, source, local_path


def _check_fields(
    *, name: str, source: str, local_path: str, max_length: int, actor: AbstractBaseUser | None
) -> tuple[str, str, str]:
    name, source, local_path = (name or "").strip(), (source or "").strip(), (local_path or "").strip()
    if not name or len(name) > 200:
        raise ApplicationError(
            "Give the model a name of 1 to 200 characters.", field_errors={"name": ["required, at most 200 characters"]}
        )
    if not source:
        raise ApplicationError(
            "Give a Hugging Face model id (org/name) or a local directory.", field_errors={"source": ["required"]}
        )
    if not 16 <= max_length <= 1_048_576:
        raise ApplicationError(
            "max_length must be between 16 and 1048576 tokens.",
            field_errors={"max_length": ["out of range [16, 1048576]"]},
        )
    _check_source(source=source, owner=actor, local_path=local_path)
    return name, source, local_path


def _check_files(*, source: str, local_path: str) -> None:
    """The files at the path the workers will be given for this model: the same resolution as theirs."""
    model_files_check(inference.base_model_path(PretrainedModel(source=source, local_path=local_path)))


@transaction.atomic
def base_model_register(
    *,
    name: str,
    source: str,
    owner: AbstractBaseUser | None = None,
    local_path: str = "",
    revision: str = "",
    max_length: int = 2048,
    chat_template_override: str = "",
    supports_tools: bool = False,
    recommended_train: dict | None = None,
) -> PretrainedModel:
    """Register a base model by Hugging Face id, or (staff only) a directory on the server.

    owner is the user registering it, who alone sees it; None registers a model shared with everyone, as
    the operator's commands do. Registering the same name again with the same source returns the existing
    row (idempotent); a different source is an error. A new model's files are checked, as a worker will
    load them, before its row is written: one a worker could not load is refused with what to fix."""
    name, source, local_path = _check_fields(
        name=name, source=source, local_path=local_path, max_length=max_length, actor=owner
    )
    recommended_train = recommended_train_check(recommended_train)
    existing = PretrainedModel.objects.filter(name=name).first()
    if existing:
        if not _visible(existing, owner):
            # Names are unique across users: say it is taken without showing the other user's model.
            raise ApplicationError(
                f"The model name {name!r} is taken; pick another.", field_errors={"name": ["already registered"]}
            )
        if existing.source != source:
            raise ApplicationError(
                f"A model named {name!r} is already registered from {existing.source}; pick another name.",
                field_errors={"name": ["already registered"]},
            )
        return existing
    if is_server_path(source) and not local_path:
        local_path = str(Path(source).expanduser().resolve())
    _check_files(source=source, local_path=local_path)
    return PretrainedModel.objects.create(
        owner=owner,
        name=name,
        source=source,
        local_path=local_path,
        revision=revision,
        max_length=max_length,
        chat_template_override=chat_template_override,
        supports_tools=supports_tools,
        recommended_train=recommended_train,
    )
