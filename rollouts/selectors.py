"""Reads for uploads, scenario sets and trajectories, scoped to what the user may see."""

from __future__ import annotations

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from rollouts.models import (
    DryRun,
    RewardFunction,
    RewardFunctionVersion,
    RolloutScript,
    RolloutScriptVersion,
    ScenarioSet,
    Trajectory,
    TrajectoryGroup,
)


def _visible(model, user) -> QuerySet:
    qs = model.objects.all()
    return qs if user.is_staff else qs.filter(owner=user)


def script_list(*, user) -> QuerySet[RolloutScript]:
    return _visible(RolloutScript, user)


def script_get(*, user, script_id: int) -> RolloutScript:
    return get_object_or_404(_visible(RolloutScript, user), id=script_id)


def reward_list(*, user) -> QuerySet[RewardFunction]:
    return _visible(RewardFunction, user)


def reward_get(*, user, reward_id: int) -> RewardFunction:
    return get_object_or_404(_visible(RewardFunction, user), id=reward_id)


def scenario_set_list(*, user) -> QuerySet[ScenarioSet]:
    return _visible(ScenarioSet, user)


def scenario_set_get(*, user, scenario_set_id: int) -> ScenarioSet:
    return get_object_or_404(_visible(ScenarioSet, user), id=scenario_set_id)


def trajectory_list(
    *,
    run,
    step: int | None = None,
    split: str | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
    q: str | None = None,
    has_error: bool | None = None,
) -> QuerySet[Trajectory]:
    """Trajectories of a run (the caller has already checked access to the run)."""
    qs = Trajectory.objects.filter(run=run).select_related("group")
    if step is not None:
        qs = qs.filter(step=step)
    if split:
        qs = qs.filter(group__split=split)
    if min_reward is not None:
        qs = qs.filter(reward__gte=min_reward)
    if max_reward is not None:
        qs = qs.filter(reward__lte=max_reward)
    if q:
        qs = qs.filter(search_text__icontains=q)
    if has_error is not None:
        qs = qs.exclude(error="") if has_error else qs.filter(error="")
    return qs.order_by("step", "group_id", "index")


def group_list(*, run, step: int | None = None, split: str | None = None) -> QuerySet[TrajectoryGroup]:
    qs = TrajectoryGroup.objects.filter(run=run).select_related("scenario")
    if step is not None:
        qs = qs.filter(step=step)
    if split:
        qs = qs.filter(split=split)
    return qs.order_by("step", "id")


# --- added for the dashboard ---------------------------------------------------------------------


def script_version_list(*, user) -> QuerySet[RolloutScriptVersion]:
    """Versions of the scripts the user may launch with (staff: all), newest first per script."""
    qs = RolloutScriptVersion.objects.select_related("asset").order_by("asset__name", "-number")
    return qs if user.is_staff else qs.filter(asset__owner=user)


def reward_version_list(*, user) -> QuerySet[RewardFunctionVersion]:
    qs = RewardFunctionVersion.objects.select_related("asset").order_by("asset__name", "-number")
    return qs if user.is_staff else qs.filter(asset__owner=user)


def dry_run_get(*, user, dry_run_id: int) -> DryRun:
    return get_object_or_404(
        _visible(DryRun, user).select_related("script_version__asset", "reward_version__asset", "base_model"),
        id=dry_run_id,
    )


def trajectory_get(*, run, trajectory_id: int) -> Trajectory:
    """One trajectory of a run (the caller has already checked access to the run), or 404."""
    return get_object_or_404(Trajectory.objects.filter(run=run), id=trajectory_id)


def group_get(*, run, group_id: int) -> TrajectoryGroup:
    return get_object_or_404(TrajectoryGroup.objects.filter(run=run).select_related("scenario"), id=group_id)
