"""Checkpoint aliases: a name of yours for one of your checkpoints, which the OpenAI endpoint answers to."""

from __future__ import annotations

import re

from django.db import transaction

from artweb.errors import ApplicationError
from artweb.visibility import may_change
from training.models import Checkpoint, PretrainedModel
from training.services.checkpoints import checkpoint_promote
from training.services.runs import run_event
from training.serving.models import CheckpointAlias

ALIAS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@transaction.atomic
def checkpoint_alias_set(*, checkpoint: Checkpoint, name: str, actor) -> CheckpointAlias:
    """Point alias `name` (of the run's owner) at this checkpoint, and promote it. An alias that named
    another checkpoint of the owner's moves here. Staff (the admin) may name anyone's checkpoint; the
    alias is still its owner's."""
    from django.http import Http404

    owner = checkpoint.run.owner
    if actor is not None and not may_change(actor, checkpoint, owner_field="run__owner"):
        raise Http404
    name = checkpoint_alias_check(checkpoint=checkpoint, name=name)
    checkpoint_promote(checkpoint=checkpoint, actor=actor)
    alias, _ = CheckpointAlias.objects.update_or_create(owner=owner, name=name, defaults={"checkpoint": checkpoint})
    run_event(
        run=checkpoint.run,
        kind="checkpoint_alias",
        message=f"Checkpoint at step {checkpoint.step} is served as '{name}'.",
        data={"checkpoint": checkpoint.id, "alias": name},
        actor=actor,
    )
    return alias


def checkpoint_alias_check(*, checkpoint: Checkpoint, name: str) -> str:
    """The alias as it will be stored; ApplicationError saying what to fix."""
    name = (name or "").strip()
    if not ALIAS.match(name):
        raise ApplicationError(
            "An alias is 1 to 100 letters, digits, '.', '_' or '-', starting with a letter or digit (no '@').",
            field_errors={"alias": ["Use letters, digits, '.', '_' and '-' only."]},
        )
    if PretrainedModel.objects.filter(name=name).exists():
        raise ApplicationError(
            f"'{name}' is a base model's name; pick another alias.", field_errors={"alias": ["Taken by a base model."]}
        )
    if checkpoint.state != Checkpoint.State.ACTIVE:
        raise ApplicationError("That checkpoint's files were deleted; it cannot be served under an alias.")
    return name


@transaction.atomic
def checkpoint_alias_delete(*, checkpoint: Checkpoint, name: str, actor) -> None:
    from django.http import Http404

    if actor is not None and not may_change(actor, checkpoint, owner_field="run__owner"):
        raise Http404
    deleted, _ = CheckpointAlias.objects.filter(checkpoint=checkpoint, owner=checkpoint.run.owner, name=name).delete()
    if not deleted:
        raise Http404
    run_event(
        run=checkpoint.run,
        kind="checkpoint_alias_removed",
        message=f"Alias '{name}' removed.",
        data={"checkpoint": checkpoint.id, "alias": name},
        actor=actor,
    )
