"""Admin for checkpoint aliases (the names the OpenAI endpoint answers to) and serving jobs."""

from django.contrib import admin, messages

from artweb.errors import ApplicationError
from training.models import CheckpointAlias, ServeJob
from training.services.serving_aliases import checkpoint_alias_set


@admin.register(CheckpointAlias)
class CheckpointAliasAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "checkpoint", "created_at")
    search_fields = ("name", "owner__username")
    raw_id_fields = ("checkpoint",)
    readonly_fields = ("owner",)

    def save_model(self, request, obj, form, change):
        # Through the service: the alias must be valid, belong to the checkpoint's owner, and promote it.
        try:
            if change:
                CheckpointAlias.objects.filter(id=obj.id).delete()
            checkpoint_alias_set(checkpoint=obj.checkpoint, name=obj.name, actor=None)
        except ApplicationError as exc:
            messages.error(request, exc.message)


@admin.register(ServeJob)
class ServeJobAdmin(admin.ModelAdmin):
    list_display = ("id", "kind", "owner", "status", "created_at", "finished_at")
    list_filter = ("kind", "status")
    readonly_fields = ("result", "params", "model_names", "error")
