from django.contrib import admin

from artweb.visibility import VisibleAdminMixin
from rollouts.models import (
    RewardFunction,
    RewardFunctionVersion,
    RolloutScript,
    RolloutScriptVersion,
    ScenarioSet,
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
class RolloutScriptAdmin(VisibleAdminMixin, admin.ModelAdmin):
    list_display = ("name", "owner", "updated_at")
    search_fields = ("name", "owner__username")
    inlines = [ScriptVersionInline]


@admin.register(RewardFunction)
class RewardFunctionAdmin(VisibleAdminMixin, admin.ModelAdmin):
    list_display = ("name", "owner", "updated_at")
    search_fields = ("name", "owner__username")
    inlines = [RewardVersionInline]


@admin.register(ScenarioSet)
class ScenarioSetAdmin(VisibleAdminMixin, admin.ModelAdmin):
    list_display = ("name", "owner", "train_count", "validation_count", "created_at")
    search_fields = ("name",)
