"""Reads for uploads and scenario sets, scoped to what the user may see."""

from __future__ import annotations

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from rollouts.models import (
    RewardFunction,
    RewardFunctionVersion,
    RolloutScript,
    RolloutScriptVersion,
    ScenarioSet,
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


def script_version_list(*, user) -> QuerySet[RolloutScriptVersion]:
    """Versions of the scripts the user may launch with (staff: all), newest first per script."""
    qs = RolloutScriptVersion.objects.select_related("asset").order_by("asset__name", "-number")
    return qs if user.is_staff else qs.filter(asset__owner=user)


def reward_version_list(*, user) -> QuerySet[RewardFunctionVersion]:
    qs = RewardFunctionVersion.objects.select_related("asset").order_by("asset__name", "-number")
    return qs if user.is_staff else qs.filter(asset__owner=user)
