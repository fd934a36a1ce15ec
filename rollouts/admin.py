from django.contrib import admin

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


class ScriptVersionInline(admin.TabularInline):
    model = RolloutScriptVersion
    fields = ("number", "sha256", "note", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False


class RewardVersionInline(admin.TabularInline):
    model = RewardFunctionVersion
    fields = ("number", "kind", "sha256", "note", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False


@admin.register(RolloutScript)
class RolloutScriptAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "updated_at")
    search_fields = ("name", "owner__username")
    inlines = [ScriptVersionInline]


@admin.register(RewardFunction)
class RewardFunctionAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "updated_at")
    search_fields = ("name", "owner__username")
    inlines = [RewardVersionInline]


@admin.register(ScenarioSet)
class ScenarioSetAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "train_count", "validation_count", "created_at")
    search_fields = ("name",)


@admin.register(TrajectoryGroup)
class TrajectoryGroupAdmin(admin.ModelAdmin):
    list_display = ("run", "step", "split", "reward_mean", "reward_std", "error_count", "skipped")
    list_filter = ("split", "skipped")
    list_select_related = ("run",)
    raw_id_fields = ("run", "scenario")


@admin.register(Trajectory)
class TrajectoryAdmin(admin.ModelAdmin):
    list_display = ("run", "step", "group", "index", "reward", "advantage", "completion_tokens")
    list_select_related = ("run",)
    raw_id_fields = ("run", "group")
    search_fields = ("search_text",)
    show_full_result_count = False  # a COUNT over millions of rows would make the page slow


@admin.register(DryRun)
class DryRunAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "script_version", "status", "created_at", "finished_at")
    list_filter = ("status",)
