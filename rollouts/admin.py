from django.contrib import admin

from artweb.visibility import VisibleAdminMixin
from rollouts.models import (
    DataAttachment,
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


@admin.register(DataAttachment)
class DataAttachmentAdmin(VisibleAdminMixin, admin.ModelAdmin):
    """Read-only here: an upload goes through its service (stored by hash, counted against the quota), and a
    delete through the Attachments page or the API, which refuse while a run needs it."""

    list_display = ("name", "owner", "size", "sha256", "created_at")
    search_fields = ("name", "owner__username", "sha256")
    readonly_fields = ("owner", "name", "description", "sha256", "size", "created_at")

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
