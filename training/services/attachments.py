"""What training rules about rollouts' data attachments: how much a user may keep (their attachment quota)
and which runs still need one. rollouts.attachments asks through the rules registered here, as rollouts
never imports training; a run's own check of the names it lists is rollouts.selectors.attachments_resolve.
"""

from __future__ import annotations

from artweb.errors import ApplicationError
from rollouts.attachments import attachment_rules_register
from training.models import Run
from training.selectors import quota_status


def quota_check_attachment(*, user, adding: int) -> None:
    """Refuse `adding` bytes of attachments that would take the user past their attachment quota."""
    line = next(line for line in quota_status(user=user) if line.key == "attachment_bytes")
    if line.limit is not None and line.used + adding > line.limit:
        raise ApplicationError(
            f"This file ({line.show(adding)}) would take your data attachments to {line.show(line.used + adding)}, "
            f"past your attachment quota of {line.limit_text} ({line.source}; {line.used_text} used). Delete "
            "attachments you no longer need, or ask an operator to raise your quota.",
            field_errors={"quota": ["attachment_bytes"]},
        )


def attachment_runs(*, attachment) -> list[str]:
    """The names of its owner's runs, not finished, whose config names the attachment (newest first): each
    of their batches binds it, so it may not be deleted under them."""
    runs = Run.objects.filter(owner_id=attachment.owner_id, config__attachments__contains=[attachment.name])
    return list(runs.exclude(status__in=Run.FINAL_STATUSES).order_by("-id").values_list("name", flat=True))


def attachment_rules_install() -> None:
    """Give rollouts' attachment services training's rules (called when the app loads)."""
    attachment_rules_register(quota_check=quota_check_attachment, used_by=attachment_runs)
