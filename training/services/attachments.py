"""What training rules about rollouts' data attachments: how much a user may keep (their attachment quota)
and what still needs one (an unfinished run, a dry run or re-score under way). rollouts.attachments asks
through the rules registered here, as rollouts never imports training; a run's own check of the names it
lists is rollouts.selectors.attachments_resolve.
"""

from __future__ import annotations

from artweb.errors import ApplicationError
from rollouts.attachments import attachment_rules_register
from training.models import DryRun, Rescore, Run
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


def attachment_uses(*, attachment) -> list[str]:
    """What still needs the attachment, in words ("the run 'x'", "the dry run #4", "the re-score #2 of the run
    'x'"): its owner's runs that are not finished and whose config names it (newest first), then their
    queued or running dry runs and re-scores that bind it (a re-score binds its run's). It may not be
    deleted under any of them."""
    owner, names = attachment.owner_id, [attachment.name]
    runs = Run.objects.filter(owner_id=owner, config__attachments__contains=names)
    unfinished = runs.exclude(status__in=Run.FINAL_STATUSES).order_by("-id").values_list("name", flat=True)
    uses = [f"the run {name!r}" for name in unfinished]
    active = (DryRun.Status.QUEUED, DryRun.Status.RUNNING)
    dry_runs = DryRun.objects.filter(owner_id=owner, attachments__contains=names, status__in=active)
    uses += [f"the dry run #{id}" for id in dry_runs.order_by("-id").values_list("id", flat=True)]
    rescores = Rescore.objects.filter(run__in=runs, status__in=active).order_by("-id")
    uses += [f"the re-score #{id} of the run {name!r}" for id, name in rescores.values_list("id", "run__name")]
    return uses


def attachment_rules_install() -> None:
    """Give rollouts' attachment services training's rules (called when the app loads)."""
    attachment_rules_register(quota_check=quota_check_attachment, used_by=attachment_uses)
