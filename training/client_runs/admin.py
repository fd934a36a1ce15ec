"""Admin for client-driven runs: the ART clients' registered models and their training jobs, to read.

Everything here is written by the protocol's services (training.client_runs.services) and by the steps
that train the jobs; the admin changes none of it. Cancel or pause such a run from the Runs admin or its
page: the client's next call answers with the reason.
"""

from django.contrib import admin
from django.template.defaultfilters import truncatechars

from artweb.visibility import VisibleAdminMixin
from training.client_runs.models import ClientModel, ClientTrainingJob, ClientTrainingJobEvent


class _ReadOnly:
    def has_add_permission(self, request, obj=None):
        return False  # registered and posted by ART clients only

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # the run's record; the client frees a name with backend.delete(model)


@admin.register(ClientModel)
class ClientModelAdmin(VisibleAdminMixin, _ReadOnly, admin.ModelAdmin):
    list_display = ("__str__", "owner", "run", "base_model_requested", "contacted_at", "created_at")
    search_fields = ("entity", "project", "name", "owner__username")
    list_select_related = ("owner", "run")
    fields = (
        "owner",
        "run",
        "entity",
        "project",
        "name",
        "inference_name",
        "base_model_requested",
        "contacted_at",
        "created_at",
    )
    readonly_fields = fields

    @admin.display(description="name it samples from")
    def inference_name(self, obj):
        return obj.inference_name


class ClientTrainingJobEventInline(admin.TabularInline):
    model = ClientTrainingJobEvent
    fields = ("type", "data", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    max_num = 0


@admin.register(ClientTrainingJob)
class ClientTrainingJobAdmin(VisibleAdminMixin, _ReadOnly, admin.ModelAdmin):
    owner_field = "run__owner"
    list_display = ("id", "run", "status", "step", "short_error", "created_at", "finished_at")
    list_filter = ("status",)
    search_fields = ("run__name", "error")
    list_select_related = ("run",)
    # The posted groups can be megabytes of JSON: the page counts them (the inspector shows them).
    fields = ("run", "status", "step", "error", "posted", "settings", "tokens", "created_at", "finished_at")
    readonly_fields = fields
    inlines = (ClientTrainingJobEventInline,)

    def get_queryset(self, request):
        return super().get_queryset(request).defer("groups")  # read on the change page only, to count them

    @admin.display(description="error")
    def short_error(self, obj):
        return truncatechars(obj.error, 120)

    @admin.display(description="posted")
    def posted(self, obj):
        trajectories = sum(len(g.get("trajectories") or []) for g in obj.groups or [])
        return f"{len(obj.groups or [])} groups, {trajectories} trajectories"
