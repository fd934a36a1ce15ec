"""Writes for data attachments: upload and delete (rollouts.services' kind, in a module of their own).

An attachment is immutable: runs name it, so a name keeps its content until it is deleted. Uploading the
same content under the same name again returns the attachment already there (a script that uploads before
each launch can run twice); other content under a taken name is refused, saying to pick another name or
delete the old one first. The bytes are stored once per content hash (rollouts.sandbox.attachments) and
removed once no attachment of anyone names them.

Two rules belong to the training app, which rollouts never imports: how much a user may keep (the
attachment quota, training.services.quotas) and what still needs an attachment (a run that is not
finished, a dry run or re-score under way). Training registers both when it loads (attachment_rules_register).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.template.defaultfilters import filesizeformat

from artweb.errors import ApplicationError
from artweb.visibility import may_change
from rollouts.models import DataAttachment
from rollouts.sandbox.attachments import (
    AttachmentTooLarge,
    attachment_keep,
    attachment_name_problem,
    attachment_path,
    attachment_receive,
)
from rollouts.selectors import attachment_dir, attachment_max_bytes

# quota_check(user=, adding=): raise ApplicationError when `adding` more bytes would pass the user's quota.
# used_by(attachment=): what still needs the attachment, in words ("the run 'x'", "the dry run #4").
_rules: dict[str, Callable] = {}


def attachment_rules_register(*, quota_check: Callable[..., None], used_by: Callable[..., list[str]]) -> None:
    _rules.update(quota_check=quota_check, used_by=used_by)


def _quota_check(user, adding: int) -> None:
    if "quota_check" in _rules:
        _rules["quota_check"](user=user, adding=adding)


def _lock_content(sha256: str) -> None:
    """Hold, until the transaction ends, the right to place or remove the stored file of this content: an
    upload and the removal after a delete of the same bytes never interleave."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [int(sha256[:15], 16)])


def attachment_name_check(name: str) -> str:
    name = (name or "").strip()
    if problem := attachment_name_problem(name):
        raise ApplicationError(problem, field_errors={"name": [problem]})
    return name


def _too_large(size: int | str) -> ApplicationError:
    limit = attachment_max_bytes()
    return ApplicationError(
        f"The file is {size if isinstance(size, str) else filesizeformat(size)}; an attachment may be at most "
        f"{filesizeformat(limit)} (ARTWEB_ATTACHMENT_MAX_MB). Upload a smaller file, or ask an operator.",
        field_errors={"file": ["too large"]},
    )


def _name_taken(name: str) -> ApplicationError:
    return ApplicationError(
        f"You already have an attachment named {name!r} with other content. Attachments never change, so "
        "runs that name one read what they were started with: upload this file under another name, or "
        "delete the old one first (when no unfinished run uses it).",
        field_errors={"name": ["already exists with other content"]},
    )


def attachment_create(
    *, owner, source: BinaryIO, name: str, size: int | None = None, description: str = ""
) -> tuple[DataAttachment, bool]:
    """Store `source` (read in chunks, never whole) as the owner's attachment `name`; (the attachment, whether
    it is new). size: the upload's size when known, to refuse a file too large, a taken name or a quota
    it would pass before any of it is written."""
    name = attachment_name_check(name)
    limit = attachment_max_bytes()
    if size is not None:
        if size > limit:
            raise _too_large(size)
        taken = DataAttachment.objects.filter(owner=owner, name=name).first()
        if taken is not None and taken.size != size:
            raise _name_taken(name)
        if taken is None:
            _quota_check(owner, size)
    try:
        incoming, sha256, size = attachment_receive(source, attachment_dir(), max_bytes=limit)
    except AttachmentTooLarge as exc:
        raise _too_large(f"larger than {filesizeformat(limit)}") from exc
    try:
        return _attachment_save(owner, name, description, incoming, sha256, size)
    finally:
        incoming.unlink(missing_ok=True)  # moved into place, or not wanted


@transaction.atomic
def _attachment_save(owner, name: str, description: str, incoming: Path, sha256: str, size: int):
    # The owner's row is locked while their usage is counted: two uploads at once cannot both fit the quota.
    get_user_model().objects.select_for_update().filter(id=owner.id).first()
    taken = DataAttachment.objects.filter(owner=owner, name=name).first()
    if taken is not None:
        if taken.sha256 != sha256:
            raise _name_taken(name)
        return taken, False
    _quota_check(owner, size)
    _lock_content(sha256)
    attachment = DataAttachment.objects.create(
        owner=owner, name=name, description=description, sha256=sha256, size=size
    )
    attachment_keep(incoming, attachment_dir(), sha256)
    return attachment, True


def attachment_delete(*, attachment: DataAttachment, actor) -> None:
    """Delete an attachment unless something not finished needs it (a run that names it, a dry run or
    re-score under way); its stored file goes once no other attachment (anyone's) has the same content."""
    if not may_change(actor, attachment):
        raise ApplicationError("That attachment is not yours.", field_errors={"attachment": ["not yours"]})
    uses = _rules["used_by"](attachment=attachment) if "used_by" in _rules else []
    if uses:
        more = f" and {len(uses) - 1} more" if len(uses) > 1 else ""
        raise ApplicationError(
            f"The attachment {attachment.name!r} is used by {uses[0]}{more}, which is not finished. "
            "Wait for it to finish, or cancel it, then delete the attachment.",
            field_errors={"attachment": ["in use"]},
        )
    sha256 = attachment.sha256
    attachment.delete()
    _content_sweep(sha256)


@transaction.atomic
def _content_sweep(sha256: str) -> None:
    _lock_content(sha256)
    if not DataAttachment.objects.filter(sha256=sha256).exists():
        attachment_path(attachment_dir(), sha256).unlink(missing_ok=True)
