"""The step's record, exactly once: the Step row and the checkpoint's, written under a conditional update
of steps_done; the step message and the exports follow the commit."""

from __future__ import annotations

from pathlib import Path

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from training.analytics.heatmap import heatmap_columns_record
from training.exports.hooks import step_committed
from training.models import Checkpoint, Run, Step
from training.services.broadcast import run_broadcast, step_message
from training.services.checkpoints import checkpoint_apply_retention
from training.services.steps.errors import StepAborted


def step_commit(run, step, stats, val_reward, metrics, timings, ckpt_dir: Path, info: dict, in_commit=None) -> None:
    """`in_commit`: what else belongs to the step's record (a client's training job marked done)."""
    with transaction.atomic():
        if (
            Run.objects.filter(id=run.id, steps_done=step - 1).update(
                steps_done=step, latest_reward=stats["reward_mean"], heartbeat_at=timezone.now()
            )
            != 1
        ):
            raise StepAborted("step already recorded")
        row = Step.objects.create(
            run=run,
            step=step,
            reward_mean=stats["reward_mean"],
            reward_std=stats["reward_std"],
            val_reward=val_reward,
            metrics=metrics,
            timings=timings,
            duration_s=timings.get("step", 0.0),
        )
        Checkpoint.objects.update_or_create(
            run=run,
            step=step,
            defaults={
                "path": str(ckpt_dir),
                "size_bytes": int(info.get("size_bytes", 0)),
                "metrics": metrics,
                "val_reward": val_reward,
                "state": Checkpoint.State.ACTIVE,
            },
        )
        # The step's groups (train and validation) are final now: the heatmap reads them from here on.
        heatmap_columns_record(run_id=run.id, step=step)
        if val_reward is not None:
            Run.objects.filter(Q(best_val_reward__isnull=True) | Q(best_val_reward__lt=val_reward), id=run.id).update(
                best_val_reward=val_reward
            )
        if in_commit is not None:
            in_commit()
        run_broadcast(run.id, step_message(row, steps_done=step, num_steps=run.num_steps), to_list=True)

        transaction.on_commit(lambda: step_committed(run_id=run.id, step=step))

    run.refresh_from_db()
    checkpoint_apply_retention(run=run)
