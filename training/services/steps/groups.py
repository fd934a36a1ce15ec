"""The step's scored groups: written (and sent to the run page once they commit), their reward and
signal figures, and the advantages of the update written back.

A scenario's rollouts are one group, or several when its rollouts return several trajectories each
(rollouts.sandbox.records.scored_groups, which the trainer splits them with too): the groups written here,
their figures and the update's advantages are those groups, in that order.
"""

from __future__ import annotations

import statistics

from django.db import transaction
from django.db.models import F, Sum

from rollouts.models import Scenario
from rollouts.sandbox.records import record_size, scored_groups
from training.analytics import learning_signals
from training.analytics.learning_signals import truncated
from training.config import RunConfig
from training.models import Run, Trajectory, TrajectoryGroup
from training.services.broadcast import final_answer, group_message, run_broadcast
from training.services.steps.errors import StepAborted


def _search_text(trajectory: dict) -> str:
    """The text the inspector's search looks in: every message's, additional histories' included."""
    histories = trajectory.get("additional_histories") or []
    parts = []
    for m in [*(trajectory.get("messages") or []), *(m for h in histories for m in h.get("messages") or [])]:
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        for call in m.get("tool_calls") or []:
            fn = (call or {}).get("function") or {}
            parts.append(f"{fn.get('name', '')} {fn.get('arguments', '')}")
    return "\n".join(parts)[:20_000]


def groups_persist(
    run: Run, step: int, split: str, scenarios: list[Scenario], results, *, me: str, failed: bool = False
) -> list[TrajectoryGroup]:
    """Write the scored groups, and send each to the run page when they commit: rewards now, while the
    update trains; the advantages follow from advantages_store. `failed`: the groups of an attempt that
    failed, kept to inspect and never trained on."""
    groups = []
    with transaction.atomic():
        # Only while this worker holds the lease, checked under the run's row lock: the heartbeat notices a
        # lost lease only every few seconds, and a batch can finish in less.
        held = (
            Run.objects.select_for_update()
            .filter(id=run.id, worker=me)
            .values_list("cancel_requested", flat=True)
            .first()
        )
        if held is None:
            raise StepAborted("lease lost")
        if held and not failed:  # cancelled while the rollouts ran: the step ends here
            raise StepAborted("cancel")
        # A crashed earlier attempt of this step may have left its groups: replace them. Those of an attempt
        # that failed (and said so) stay, marked.
        replaced = TrajectoryGroup.objects.filter(run=run, step=step, split=split, failed_attempt=False)
        freed = replaced.aggregate(total=Sum("stored_bytes"))["total"] or 0
        replaced.delete()
        stored = 0  # bytes of the trajectories written here, measured as the worker's record limit measures them
        for scenario, result in zip(scenarios, results, strict=False):
            for trajs in scored_groups(result.trajectories):
                group = _group_create(run, step, split, scenario, trajs, failed=failed)
                stored += group.stored_bytes
                groups.append(group)
        # What the owner's storage quota counts (training.services.quotas), in the groups' own transaction.
        Run.objects.filter(id=run.id).update(trajectory_bytes=F("trajectory_bytes") + stored - freed)
    return groups


def _group_create(run: Run, step: int, split: str, scenario: Scenario, trajs: list[dict], *, failed: bool):
    """One group's row and its trajectories' rows, sent to the run page once they commit."""
    rewards = [t["reward"] for t in trajs if t.get("reward") is not None]
    group = TrajectoryGroup.objects.create(
        run=run,
        step=step,
        split=split,
        scenario=scenario,
        reward_mean=statistics.fmean(rewards) if rewards else None,
        reward_std=statistics.pstdev(rewards) if len(rewards) > 1 else (0.0 if rewards else None),
        error_count=sum(1 for t in trajs if t.get("error")),
        skipped=_no_signal(trajs),
        failed_attempt=failed,
        stored_bytes=sum(record_size(t) for t in trajs),
    )
    rows = Trajectory.objects.bulk_create(
        [
            Trajectory(
                group=group,
                run=run,
                step=step,
                index=i,
                messages=t.get("messages") or [],
                tools=t.get("tools"),
                additional_histories=t.get("additional_histories") or [],
                reward=t.get("reward"),
                metrics=t.get("metrics") or {},
                metadata=t.get("metadata") or {},
                logs=t.get("logs") or [],
                error=t.get("error") or "",
                prompt_tokens=t.get("prompt_tokens") or 0,
                completion_tokens=t.get("completion_tokens") or 0,
                duration_ms=t.get("duration_ms") or 0,
                search_text=_search_text(t),
                reward_ms=t.get("reward_ms"),
                truncated=truncated(t.get("messages") or []),
            )
            for i, t in enumerate(trajs)
        ]
    )
    run_broadcast(run.id, group_message(group, rows))  # leaves on commit; PostgreSQL set the ids
    return group


def _no_signal(trajs: list[dict]) -> bool:
    """All the group's rewards are equal (or it has fewer than two): GRPO has nothing to compare."""
    rewards = [t["reward"] for t in trajs if t.get("reward") is not None]
    return len(set(rewards)) <= 1


def reward_stats(results, cfg: RunConfig | None = None) -> dict:
    """The step's reward and signal figures, from its scored groups (before the update)."""
    groups = [g for r in results for g in scored_groups(r.trajectories)]
    trajs = [t for g in groups for t in g]
    rewards = [t["reward"] for t in trajs if t.get("reward") is not None]
    finished = [t for t in trajs if not t.get("error")]
    completion = [t.get("completion_tokens") or 0 for t in finished]
    stats = {
        "groups": len(groups),
        "groups_no_signal": sum(1 for g in groups if _no_signal(g)),
        "reward_mean": statistics.fmean(rewards) if rewards else None,
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else None,
        "rollouts": len(trajs),
        "rollout_errors": sum(1 for t in trajs if t.get("error")),
        "completion_tokens_mean": statistics.fmean(completion) if completion else 0.0,
        "completion_tokens_total": sum(completion),
    }
    stats["dead_group_share"] = stats["groups_no_signal"] / len(groups) if groups else None
    stats["truncation_rate"] = (
        sum(1 for t in finished if truncated(t.get("messages") or [])) / len(finished) if finished else None
    )
    stats.update(
        learning_signals.answer_repeat(
            [[final_answer(t.get("messages")) for t in g if not t.get("error")] for g in groups]
        )
    )
    names = cfg.alerts.reward_components if cfg is not None else []
    stats.update(learning_signals.component_shares(finished, names))
    return stats


def advantages_store(groups: list[TrajectoryGroup], advantages) -> None:
    """Write the update's advantages, then send each group again, now with them (on commit)."""
    rows = []
    with transaction.atomic():
        for group, advs in zip(groups, advantages, strict=False):
            trajs = list(group.trajectories.all().order_by("index"))
            for traj in trajs:
                if traj.index < len(advs) and advs[traj.index] is not None:
                    traj.advantage = float(advs[traj.index])
                    rows.append(traj)
            run_broadcast(group.run_id, group_message(group, trajs))
        Trajectory.objects.bulk_update(rows, ["advantage"], batch_size=1000)
