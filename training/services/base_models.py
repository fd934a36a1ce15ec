from __future__ import annotations

from pathlib import Path

from django.db import transaction

from artweb.errors import ApplicationError
from training.models import BaseModel


@transaction.atomic
def base_model_register(*, name: str, source: str, owner=None, local_path: str = "", revision: str = "",
                        max_length: int = 2048, chat_template_override: str = "",
                        supports_tools: bool = False) -> BaseModel:
    """Register a base model by Hugging Face id or local directory. Registering the same name again
    with the same source returns the existing row (idempotent); a different source is an error."""
    name, source = (name or "").strip(), (source or "").strip()
    if not name:
        raise ApplicationError("Give the model a name.", field_errors={"name": ["required"]})
    if not source:
        raise ApplicationError("Give a Hugging Face model id (org/name) or a local directory.",
                               field_errors={"source": ["required"]})
    if not 16 <= max_length <= 1_048_576:
        raise ApplicationError("max_length must be between 16 and 1048576 tokens.",
                               field_errors={"max_length": ["out of range [16, 1048576]"]})
    if source.startswith(("/", ".")) and not (Path(source) / "config.json").exists():
        raise ApplicationError(f"{source} is not a model directory (no config.json in it).",
                               field_errors={"source": ["not a model directory"]})
    existing = BaseModel.objects.filter(name=name).first()
    if existing:
        if existing.source != source:
            raise ApplicationError(f"A model named {name!r} is already registered from {existing.source}.",
                                   field_errors={"name": ["already registered"]})
        return existing
    return BaseModel.objects.create(
        owner=owner, name=name, source=source, local_path=local_path or (source if source.startswith("/") else ""),
        revision=revision, max_length=max_length, chat_template_override=chat_template_override,
        supports_tools=supports_tools,
    )
