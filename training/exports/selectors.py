"""Reads: which targets apply to a run, the key a target uses, and what a person may see of a target."""

from __future__ import annotations

import os

from django.db.models import Q
from django.shortcuts import get_object_or_404

from artweb.visibility import own
from training.exports.base import ExportError
from training.exports.crypto import SecretUnreadable, secret_decrypt, secret_mask
from training.models import ExportProgress, ExportTarget, Run

# Where the key of an operator's target comes from when none is stored: the worker's environment.
ENV_SECRET = {
    ExportTarget.Kind.WANDB: "WANDB_API_KEY",
    ExportTarget.Kind.WEAVE: "WANDB_API_KEY",
    ExportTarget.Kind.LANGFUSE: "LANGFUSE_SECRET_KEY",
}


def export_targets_for_run(*, run: Run, include_disabled: bool = False) -> list[ExportTarget]:
    """One target per kind: the run's own, else its owner's. A disabled run target opts the run out."""
    chosen: dict[str, ExportTarget] = {}
    rows = ExportTarget.objects.filter(Q(run=run) | Q(run__isnull=True, owner_id=run.owner_id))
    for target in sorted(rows, key=lambda t: t.run_id is not None):  # run targets last: they win
        chosen[target.kind] = target
    return [t for t in chosen.values() if include_disabled or t.enabled]


def export_target_uses_worker_env(target: ExportTarget) -> bool:
    """Whether what the target leaves empty (its key, its server) may come from the worker's environment.

    Only for a staff member's target: the worker's WANDB_API_KEY / LANGFUSE_* are the operator's own
    credentials. Anyone else's target would otherwise export into the operator's account, send the
    operator's key to a server of its owner's choosing (base_url / host), or hand it to the owner's
    rollout script (Weave); so theirs uses only what is stored on it.
    """
    return bool(target.owner.is_staff)


def export_target_list(*, owner, run: Run | None = None) -> list[ExportTarget]:
    """The owner's own targets (of one run, if given): a setting, artweb.visibility.own."""
    qs = own(ExportTarget.objects.select_related("owner", "run"), owner)
    return list(qs.filter(run=run) if run is not None else qs)


def export_target_get(*, user, target_id: int) -> ExportTarget:
    """One of the user's own targets, or 404: someone else's reads as missing, never as forbidden.

    Staff too see only their own here; the admin is where they manage everyone's (artweb.visibility.own).
    """
    return get_object_or_404(own(ExportTarget.objects.select_related("owner", "run"), user), id=target_id)


def export_target_public(target: ExportTarget) -> dict:
    """A target as the API and pages show it: the key masked to its last four characters."""
    if target.secret_encrypted:
        source = "stored"
    else:
        source = "worker environment" if export_target_uses_worker_env(target) else "none"
    return {
        "id": target.id,
        "kind": target.kind,
        "run": target.run_id,
        "enabled": target.enabled,
        "settings": target.settings,
        "secret": secret_mask(target.secret_last4) if target.secret_encrypted else "",
        "secret_source": source,
        "last_error": target.last_error,
        "last_error_at": target.last_error_at,
        "last_success_at": target.last_success_at,
        "created_at": target.created_at,
        "updated_at": target.updated_at,
    }


def export_status_for_run(*, run: Run) -> list[dict]:
    """Per target: how far the run is mirrored and the latest error, for the run page."""
    progress = {p.target_id: p for p in ExportProgress.objects.filter(run=run)}
    out = []
    for target in export_targets_for_run(run=run):
        p = progress.get(target.id)
        out.append(
            {
                "target": target.id,
                "kind": target.kind,
                "last_step": p.last_step if p else 0,
                "finished": bool(p and p.finished),
                "last_error": p.last_error if p else "",
                "last_error_at": p.last_error_at if p else None,
            }
        )
    return out


def export_target_secret(target: ExportTarget) -> str:
    """The key to use: the stored one; for the operator's own targets only, else the worker's
    environment (see selectors.export_target_uses_worker_env); else ""."""
    if target.secret_encrypted:
        try:
            return secret_decrypt(target.secret_encrypted)
        except SecretUnreadable as exc:
            raise ExportError(str(exc)) from exc
    if not export_target_uses_worker_env(target):
        return ""
    return os.environ.get(ENV_SECRET[target.kind], "")
