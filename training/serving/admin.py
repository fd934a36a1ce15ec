"""Admin for checkpoint aliases (the names the OpenAI endpoint answers to) and serving jobs."""

from django import forms
from django.contrib import admin

from artweb.errors import ApplicationError
from artweb.visibility import VisibleAdminMixin
from training.serving.models import CheckpointAlias, ServeJob
from training.serving.services.aliases import checkpoint_alias_check, checkpoint_alias_set


class CheckpointAliasForm(forms.ModelForm):
    class Meta:
        model = CheckpointAlias
        fields = ("name", "checkpoint")

    def clean(self):
        data = super().clean()
        checkpoint, name = data.get("checkpoint"), data.get("name")
        if checkpoint is not None and name:
            try:
                checkpoint_alias_check(checkpoint=checkpoint, name=name)
            except ApplicationError as exc:
                raise forms.ValidationError(exc.message) from None
            taken = CheckpointAlias.objects.filter(owner=checkpoint.run.owner, name=name.strip())
            if self.instance.pk:
                taken = taken.exclude(pk=self.instance.pk)
            if taken.exists():
                raise forms.ValidationError(f"{checkpoint.run.owner} already has an alias {name!r}.")
        return data


@admin.register(CheckpointAlias)
class CheckpointAliasAdmin(VisibleAdminMixin, admin.ModelAdmin):
    """Aliases go through the service: a valid name, the checkpoint's owner's, and the checkpoint promoted."""

    form = CheckpointAliasForm
    list_display = ("name", "owner", "checkpoint", "created_at")
    search_fields = ("name", "owner__username")
    raw_id_fields = ("checkpoint",)

    def save_model(self, request, obj, form, change):
        if change:
            CheckpointAlias.objects.filter(pk=obj.pk).delete()
        alias = checkpoint_alias_set(checkpoint=obj.checkpoint, name=obj.name, actor=request.user)
        obj.pk, obj.owner, obj.created_at = alias.pk, alias.owner, alias.created_at


@admin.register(ServeJob)
class ServeJobAdmin(VisibleAdminMixin, admin.ModelAdmin):
    list_display = ("id", "kind", "owner", "status", "created_at", "finished_at")
    list_filter = ("kind", "status")
    readonly_fields = ("result", "params", "model_names", "error")
