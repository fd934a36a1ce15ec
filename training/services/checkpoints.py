"""Checkpoint management: delete files (row kept), retention, promotion, archives for download.

A checkpoint still needed is never deleted: the newest of a run that is not finished (it resumes from
it) and any adapter a run step's inference server has loaded now (training.services.inference
.adapters_loaded_publish: the OpenAI endpoint's copies do not count).
"""

from __future__ import annotations

import os
import shutil
import tarfile
import time
import uuid
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from artweb.errors import ApplicationError
from rollouts.inference.work_dirs import work_dirs_remove_orphaned
from training.models import Checkpoint, Run
from training.services.runs import run_event


def _loaded_adapter_paths() -> set[str]:
    """Adapter directories any inference server reports as loaded (kept in Redis by the workers)."""
    from django.core.cache import cache

    from artweb.cache import riding_out_outages

    return set(riding_out_outages(lambda: cache.get("artweb:loaded_adapters", []), what="the loaded adapters") or [])


def checkpoint_protection_reason(checkpoint: Checkpoint) -> str | None:
    run = checkpoint.run
    if run.status not in Run.FINAL_STATUSES:
        newest = Checkpoint.objects.filter(run=run, state=Checkpoint.State.ACTIVE).order_by("-step").first()
        if newest and newest.id == checkpoint.id:
            return f"it is the newest checkpoint of run {run.name}, which is {run.status} and resumes from it"
    if checkpoint.path in _loaded_adapter_paths():
        return "the inference server has it loaded"
    return None


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


@transaction.atomic
def checkpoint_delete(*, checkpoint: Checkpoint, actor=None, reason: str = "deleted") -> Checkpoint:
    """Delete a checkpoint's files; the row stays, marked deleted."""
    checkpoint = Checkpoint.objects.select_for_update().select_related("run").get(id=checkpoint.id)
    if checkpoint.state == Checkpoint.State.DELETED:
        return checkpoint
    why = checkpoint_protection_reason(checkpoint)
    if why:
        raise ApplicationError(f"Checkpoint {checkpoint} cannot be deleted: {why}.")
    path = Path(checkpoint.path)
    Checkpoint.objects.filter(id=checkpoint.id).update(state=Checkpoint.State.DELETED, deleted_at=timezone.now())
    run_event(
        run=checkpoint.run,
        kind="checkpoint_deleted",
        message=f"Checkpoint at step {checkpoint.step} {reason}.",
        data={"checkpoint": checkpoint.id, "step": checkpoint.step, "size_bytes": checkpoint.size_bytes},
        actor=actor,
    )
    # Remove files only once the row says so for good; a failed commit leaves the files.
    archive = _archive_path(checkpoint)
    transaction.on_commit(lambda: (shutil.rmtree(path, ignore_errors=True), archive.unlink(missing_ok=True)))
    checkpoint.refresh_from_db()
    return checkpoint


@transaction.atomic
def checkpoint_promote(*, checkpoint: Checkpoint, actor=None) -> Checkpoint:
    """Mark a checkpoint as the run's chosen one (kept by retention, shown first)."""
    if checkpoint.state == Checkpoint.State.DELETED:
        raise ApplicationError("That checkpoint's files were deleted; it cannot be promoted.")
    Checkpoint.objects.filter(run=checkpoint.run, promoted=True).exclude(id=checkpoint.id).update(promoted=False)
    Checkpoint.objects.filter(id=checkpoint.id).update(promoted=True)
    run_event(
        run=checkpoint.run,
        kind="checkpoint_promoted",
        message=f"Checkpoint at step {checkpoint.step} promoted.",
        data={"checkpoint": checkpoint.id, "step": checkpoint.step},
        actor=actor,
    )
    checkpoint.refresh_from_db()
    return checkpoint


def checkpoint_retention_plan(*, run: Run, keep_last: int, keep_best: int) -> tuple[list[Checkpoint], list[Checkpoint]]:
    """(keep, delete) among the run's active checkpoints: the newest keep_last, the best keep_best by
    validation reward, promoted ones, and protected ones are kept."""
    active = list(Checkpoint.objects.filter(run=run, state=Checkpoint.State.ACTIVE).order_by("-step"))
    keep_ids = {c.id for c in active[:keep_last]}
    scored = sorted((c for c in active if c.val_reward is not None), key=lambda c: (-c.val_reward, -c.step))
    keep_ids |= {c.id for c in scored[:keep_best]}
    keep_ids |= {c.id for c in active if c.promoted or checkpoint_protection_reason(c)}
    return [c for c in active if c.id in keep_ids], [c for c in active if c.id not in keep_ids]


def checkpoint_apply_retention(
    *, run: Run, keep_last: int | None = None, keep_best: int | None = None, actor=None
) -> list[Checkpoint]:
    """Delete what the run's retention policy does not keep; returns the deleted checkpoints."""
    keep_last = keep_last if keep_last is not None else int(run.config.get("keep_last_checkpoints", 2))
    keep_best = keep_best if keep_best is not None else int(run.config.get("keep_best_checkpoints", 1))
    if keep_last < 1:
        raise ApplicationError("Retention must keep at least the newest checkpoint (keep_last ≥ 1).")
    _, delete = checkpoint_retention_plan(run=run, keep_last=keep_last, keep_best=keep_best)
    deleted = [checkpoint_delete(checkpoint=c, actor=actor, reason="deleted by retention") for c in delete]
    checkpoint_remove_abandoned(run=run)
    work_dirs_remove_orphaned()  # inference servers' merged weights left by a worker that died on this host
    return deleted


ABANDONED_AFTER_SECONDS = 3600


def checkpoint_remove_abandoned(*, run: Run, older_than_s: float = ABANDONED_AFTER_SECONDS) -> list[Path]:
    """Remove the run's checkpoint directories that no checkpoint row names and that nobody has written
    to for older_than_s: attempts of a worker killed between writing its checkpoint and committing the
    step (each attempt writes a directory of its own, so these never hold a committed step)."""
    root = Path(settings.DATA_DIR) / "checkpoints" / f"run-{run.id}"
    if not root.is_dir():
        return []
    named = {Path(p).resolve() for p in Checkpoint.objects.filter(run=run).values_list("path", flat=True)}
    cutoff = time.time() - older_than_s
    removed = []
    for path in root.iterdir():
        if path.is_dir() and path.resolve() not in named and path.stat().st_mtime < cutoff:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def checkpoint_archive(*, checkpoint: Checkpoint) -> Path:
    """A .tar.gz of the checkpoint's adapter files (cached next to the checkpoint directory)."""
    if checkpoint.state == Checkpoint.State.DELETED:
        raise ApplicationError("That checkpoint's files were deleted.")
    src = Path(checkpoint.path)
    if not src.exists():
        raise ApplicationError("The checkpoint's files are missing on disk.")
    out = _archive_path(checkpoint)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists():
        # A name of its own per download in progress: two first downloads each write theirs, and the
        # rename makes one of the identical archives the cached one.
        tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.partial")
        try:
            with tarfile.open(tmp, "w:gz") as tar:
                for name in ("adapter_config.json", "adapter_model.safetensors", "README.md"):
                    if (src / name).exists():
                        tar.add(src / name, arcname=f"run{checkpoint.run_id}-step{checkpoint.step}/{name}")
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    return out


def _archive_path(checkpoint: Checkpoint) -> Path:
    return (
        Path(settings.DATA_DIR)
        / "archives"
        / f"run{checkpoint.run_id}-step{checkpoint.step}-{checkpoint.id}-adapter.tar.gz"
    )


def checkpoint_disk_usage() -> int:
    from django.db.models import Sum

    return Checkpoint.objects.filter(state=Checkpoint.State.ACTIVE).aggregate(s=Sum("size_bytes"))["s"] or 0
