"""Admin: checkpoint management first (delete files, retention, promote, download), useful pages for the rest.
Every action goes through a service, which writes the run's event."""

from django.contrib import admin, messages
from django.http import FileResponse
from django.template.defaultfilters import filesizeformat

from artweb.errors import ApplicationError
from training.models import BaseModel, Checkpoint, Run, RunEvent, RunLog, Step
from training.services.checkpoints import (
    checkpoint_apply_retention,
    checkpoint_archive,
    checkpoint_delete,
    checkpoint_disk_usage,
    checkpoint_promote,
)


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ("__str__", "run", "step", "size", "val_reward", "state", "promoted", "created_at")
    list_filter = ("state", "promoted", "run__status", "run__base_model")
    search_fields = ("run__name", "path", "run__owner__username")
    list_select_related = ("run",)
    readonly_fields = ("run", "step", "path", "size_bytes", "metrics", "val_reward", "state", "created_at", "deleted_at")
    actions = ["delete_files", "apply_retention", "promote", "download_archive"]

    @admin.display(description="size on disk", ordering="size_bytes")
    def size(self, obj):
        return "—" if obj.state == Checkpoint.State.DELETED else filesizeformat(obj.size_bytes)

    def changelist_view(self, request, extra_context=None):
        extra_context = extra_context or {}
        extra_context["title"] = f"Checkpoints — {filesizeformat(checkpoint_disk_usage())} on disk"
        return super().changelist_view(request, extra_context=extra_context)

    def has_add_permission(self, request):
        return False  # checkpoints are written by workers only

    def has_delete_permission(self, request, obj=None):
        return False  # rows stay as the record; "Delete files" removes the files

    @admin.action(description="Delete files (keep the row, marked deleted)")
    def delete_files(self, request, queryset):
        done = 0
        for ckpt in queryset.select_related("run"):
            try:
                checkpoint_delete(checkpoint=ckpt, actor=request.user)
                done += 1
            except ApplicationError as exc:
                self.message_user(request, exc.message, messages.WARNING)
        self.message_user(request, f"Deleted the files of {done} checkpoint(s).")

    @admin.action(description="Apply each run's retention policy")
    def apply_retention(self, request, queryset):
        deleted = 0
        for run in Run.objects.filter(id__in=queryset.values("run_id")):
            deleted += len(checkpoint_apply_retention(run=run, actor=request.user))
        self.message_user(request, f"Retention deleted {deleted} checkpoint(s).")

    @admin.action(description="Promote (mark as the run's chosen checkpoint)")
    def promote(self, request, queryset):
        for ckpt in queryset:
            try:
                checkpoint_promote(checkpoint=ckpt, actor=request.user)
            except ApplicationError as exc:
                self.message_user(request, exc.message, messages.WARNING)

    @admin.action(description="Download adapter archive (one checkpoint)")
    def download_archive(self, request, queryset):
        if queryset.count() != 1:
            self.message_user(request, "Pick exactly one checkpoint to download.", messages.WARNING)
            return None
        try:
            path = checkpoint_archive(checkpoint=queryset.get())
        except ApplicationError as exc:
            self.message_user(request, exc.message, messages.WARNING)
            return None
        return FileResponse(open(path, "rb"), as_attachment=True, filename=path.name)


class StepInline(admin.TabularInline):
    model = Step
    fields = ("step", "reward_mean", "val_reward", "duration_s", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    max_num = 0


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "owner", "status", "steps_done", "num_steps", "latest_reward", "best_val_reward",
                    "worker", "created_at")
    list_filter = ("status", "base_model")
    search_fields = ("name", "owner__username", "tags")
    readonly_fields = ("steps_done", "worker", "heartbeat_at", "started_at", "finished_at", "config", "error")
    list_select_related = ("owner",)


@admin.register(BaseModel)
class BaseModelAdmin(admin.ModelAdmin):
    list_display = ("name", "source", "owner", "max_length", "supports_tools", "created_at")
    search_fields = ("name", "source")


@admin.register(RunEvent)
class RunEventAdmin(admin.ModelAdmin):
    list_display = ("run", "kind", "message", "actor", "created_at")
    list_filter = ("kind",)
    search_fields = ("run__name", "message")
    list_select_related = ("run", "actor")


@admin.register(RunLog)
class RunLogAdmin(admin.ModelAdmin):
    list_display = ("run", "step", "level", "message", "created_at")
    list_filter = ("level",)
    search_fields = ("message",)


@admin.register(Step)
class StepAdmin(admin.ModelAdmin):
    list_display = ("run", "step", "reward_mean", "val_reward", "duration_s", "created_at")
    list_select_related = ("run",)
    search_fields = ("run__name",)
