"""Admin: checkpoint management first (delete files, retention, promote, download), quotas, useful pages for the rest.
Every action goes through a service, which writes the run's event; every list shows the rows its staff member may
see (artweb.visibility: every one)."""

from django import forms
from django.contrib import admin, messages
from django.http import FileResponse
from django.template.defaultfilters import filesizeformat
from django.utils.html import format_html, format_html_join

from artweb.errors import ApplicationError
from artweb.visibility import VisibleAdminMixin
from training.exports.schemas import export_settings_parse
from training.exports.selectors import export_target_public
from training.exports.services import export_target_create, export_target_test, export_target_update
from training.models import (
    Checkpoint,
    DryRun,
    ExportTarget,
    PretrainedModel,
    Quota,
    Run,
    RunEvent,
    RunLog,
    Step,
    Trajectory,
    TrajectoryGroup,
)
from training.selectors import quota_status, share_weights
from training.services.base_models import base_model_check, recommended_train_check
from training.services.checkpoints import (
    checkpoint_apply_retention,
    checkpoint_archive,
    checkpoint_delete,
    checkpoint_disk_usage,
    checkpoint_promote,
)
from training.services.quotas import trajectory_bytes_recount
from training.services.runs import run_cancel, run_details_update, run_pause, run_resume, run_retry


@admin.register(Checkpoint)
class CheckpointAdmin(VisibleAdminMixin, admin.ModelAdmin):
    owner_field = "run__owner"
    list_display = ("__str__", "run", "step", "size", "val_reward", "state", "promoted", "created_at")
    list_filter = ("state", "promoted", "run__status", "run__base_model")
    search_fields = ("run__name", "path", "run__owner__username")
    list_select_related = ("run",)
    readonly_fields = (
        "run",
        "step",
        "path",
        "size_bytes",
        "metrics",
        "val_reward",
        "state",
        "created_at",
        "deleted_at",
    )
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
class RunAdmin(VisibleAdminMixin, admin.ModelAdmin):
    """Runs change state only through their services (a conditional transition with a RunEvent naming
    the staff member): status and the worker's bookkeeping are read-only here, the actions below cancel,
    pause, resume or retry, and an edit of the name or tags is recorded as an event too."""

    list_display = (
        "id",
        "name",
        "owner",
        "status",
        "steps_done",
        "num_steps",
        "latest_reward",
        "best_val_reward",
        "worker",
        "created_at",
    )
    list_filter = ("status", "driver", "base_model")
    search_fields = ("name", "owner__username", "tags")
    fields = (
        "name",
        "tags",
        "owner",
        "status",
        "base_model",
        "driver",  # "client": an ART client posts its groups (no script; its model and jobs: client_runs' admin)
        "script_version",
        "reward_version",
        "scenario_set",
        "steps_done",
        "num_steps",
        "latest_reward",
        "best_val_reward",
        "error",
        "stored_trajectories",
        "cancel_requested",
        "pause_requested",
        "worker",
        "heartbeat_at",
        "dispatched_at",
        "created_at",
        "started_at",
        "finished_at",
        "config",
    )
    readonly_fields = tuple(f for f in fields if f not in ("name", "tags"))
    list_select_related = ("owner",)
    actions = ("cancel_runs", "pause_runs", "resume_runs", "retry_runs")

    @admin.display(description="stored trajectories", ordering="trajectory_bytes")
    def stored_trajectories(self, obj):
        return filesizeformat(obj.trajectory_bytes)  # what its owner's storage quota counts

    def has_add_permission(self, request):
        return False  # a run is launched from its page or the API, which validate it (run_create)

    def save_model(self, request, obj, form, change):
        run_details_update(run=obj, name=obj.name, tags=obj.tags, actor=request.user)

    def _each(self, request, queryset, service, done: str) -> None:
        count = 0
        for run in queryset:
            try:
                service(run=run, actor=request.user)
            except ApplicationError as exc:
                self.message_user(request, f"{run}: {exc.message}", messages.WARNING)
            else:
                count += 1
        if count:
            self.message_user(request, f"{count} run(s) {done}.", messages.SUCCESS)

    @admin.action(description="Cancel the selected runs")
    def cancel_runs(self, request, queryset):
        self._each(request, queryset, run_cancel, "cancelled or asked to stop")

    @admin.action(description="Pause the selected runs")
    def pause_runs(self, request, queryset):
        self._each(request, queryset, run_pause, "paused or asked to pause")

    @admin.action(description="Resume the selected paused runs")
    def resume_runs(self, request, queryset):
        self._each(request, queryset, run_resume, "resumed")

    @admin.action(description="Retry the selected failed or cancelled runs")
    def retry_runs(self, request, queryset):
        self._each(request, queryset, run_retry, "queued again")


class BaseModelAdminForm(forms.ModelForm):
    class Meta:
        model = PretrainedModel
        fields = (
            "owner",
            "name",
            "source",
            "revision",
            "local_path",
            "max_length",
            "chat_template_override",
            "supports_tools",
            "recommended_train",
        )

    def clean_recommended_train(self):
        try:
            return recommended_train_check(self.cleaned_data.get("recommended_train"))
        except ApplicationError as exc:
            raise forms.ValidationError(exc.message) from exc

    def clean(self):
        """The service's name and source rules, with the staff member as the one acting."""
        data = super().clean()
        if self.errors:
            return data
        try:
            data["name"], data["source"], data["local_path"] = base_model_check(
                name=data.get("name", ""),
                source=data.get("source", ""),
                local_path=data.get("local_path", ""),
                max_length=data.get("max_length") or 0,
                actor=self.actor,
            )
        except ApplicationError as exc:
            for field, errors in exc.field_errors.items():
                if field in self.fields:
                    self.add_error(field, errors)
            if not any(field in self.fields for field in exc.field_errors):
                raise forms.ValidationError(exc.message) from exc
        return data


@admin.register(PretrainedModel)
class BaseModelAdmin(VisibleAdminMixin, admin.ModelAdmin):
    form = BaseModelAdminForm

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        form.actor = request.user  # the rules (a server directory needs staff) depend on who acts
        return form

    list_display = ("name", "source", "owner", "max_length", "supports_tools", "created_at")
    search_fields = ("name", "source")


@admin.register(RunEvent)
class RunEventAdmin(VisibleAdminMixin, admin.ModelAdmin):
    owner_field = "run__owner"
    list_display = ("run", "kind", "message", "actor", "created_at")
    list_filter = ("kind",)
    search_fields = ("run__name", "message")
    list_select_related = ("run", "actor")


@admin.register(RunLog)
class RunLogAdmin(VisibleAdminMixin, admin.ModelAdmin):
    owner_field = "run__owner"
    list_display = ("run", "step", "level", "message", "created_at")
    list_filter = ("level",)
    search_fields = ("message",)


@admin.register(Step)
class StepAdmin(VisibleAdminMixin, admin.ModelAdmin):
    owner_field = "run__owner"
    list_display = ("run", "step", "reward_mean", "val_reward", "duration_s", "created_at")
    list_select_related = ("run",)
    search_fields = ("run__name",)


class ExportTargetAdminForm(forms.ModelForm):
    """The key is write-only here as everywhere: a new one replaces the stored one, none keeps it."""

    new_secret = forms.CharField(
        required=False,
        max_length=1000,
        label="New key",
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Stored encrypted and never shown. Leave empty to keep the stored key.",
    )
    clear_secret = forms.BooleanField(required=False, label="Remove the stored key")

    class Meta:
        model = ExportTarget
        fields = ("owner", "run", "kind", "enabled", "settings")

    def clean(self):
        cleaned = super().clean()
        kind = cleaned.get("kind") or self.instance.kind
        if kind:
            try:
                cleaned["settings"] = export_settings_parse(kind, cleaned.get("settings")).model_dump()
            except ApplicationError as exc:
                for key, msgs in exc.field_errors.items():
                    self.add_error("settings" if key.startswith("settings") else None, f"{key}: {msgs[0]}")
        return cleaned


@admin.register(ExportTarget)
class ExportTargetAdmin(VisibleAdminMixin, admin.ModelAdmin):
    """Everyone's export targets. Saving goes through the export services, as the page and the API do."""

    form = ExportTargetAdminForm
    list_display = ("__str__", "owner", "run", "kind", "enabled", "key", "last_success_at", "last_error")
    list_filter = ("kind", "enabled")
    search_fields = ("owner__username", "run__name")
    list_select_related = ("owner", "run")
    raw_id_fields = ("run",)
    readonly_fields = ("key", "last_error", "last_error_at", "last_success_at", "created_at", "updated_at")
    actions = ("send_test_event",)

    @admin.display(description="key")
    def key(self, obj):
        public = export_target_public(obj)
        return public["secret"] or f"({public['secret_source']})"

    def get_readonly_fields(self, request, obj=None):
        # Owner, run and kind make the target what it is; change them by adding another.
        return self.readonly_fields + (("owner", "run", "kind") if obj else ())

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        secret = "" if data.get("clear_secret") else (data.get("new_secret") or None)
        if change:
            export_target_update(
                target=ExportTarget.objects.get(id=obj.id),
                actor=request.user,
                settings=data["settings"],
                secret=secret,
                enabled=data["enabled"],
            )
        else:
            target = export_target_create(
                owner=data["owner"],
                kind=data["kind"],
                settings=data["settings"],
                secret=secret or "",
                run=data.get("run"),
                enabled=data["enabled"],
            )
            obj.id = target.id
        obj.refresh_from_db()

    @admin.action(description="Send a test event")
    def send_test_event(self, request, queryset):
        for target in queryset.select_related("owner"):
            result = export_target_test(target=target, actor=request.user)
            self.message_user(request, f"{target}: {result.message}", messages.SUCCESS if result.ok else messages.ERROR)


class _RecountOnDelete:
    """A deletion in this admin counts the stored bytes of what held the deleted rows again (their owners'
    storage quota): `held_by` names the field ("run" or "group") whose rows are recounted."""

    held_by: str

    def delete_model(self, request, obj):
        super().delete_model(request, obj)
        trajectory_bytes_recount(**{f"{self.held_by}_ids": {getattr(obj, f"{self.held_by}_id")}})

    def delete_queryset(self, request, queryset):
        ids = set(queryset.values_list(f"{self.held_by}_id", flat=True))
        super().delete_queryset(request, queryset)
        trajectory_bytes_recount(**{f"{self.held_by}_ids": ids})


@admin.register(TrajectoryGroup)
class TrajectoryGroupAdmin(VisibleAdminMixin, _RecountOnDelete, admin.ModelAdmin):
    owner_field = "run__owner"
    list_display = ("run", "step", "split", "reward_mean", "reward_std", "error_count", "skipped")
    list_filter = ("split", "skipped")
    list_select_related = ("run",)
    raw_id_fields = ("run", "scenario")
    held_by = "run"


@admin.register(Trajectory)
class TrajectoryAdmin(VisibleAdminMixin, _RecountOnDelete, admin.ModelAdmin):
    owner_field = "run__owner"
    list_display = ("run", "step", "group", "index", "reward", "advantage", "completion_tokens")
    list_select_related = ("run",)
    raw_id_fields = ("run", "group")
    search_fields = ("search_text",)
    show_full_result_count = False  # a COUNT over millions of rows would make the page slow
    held_by = "group"  # recounting a group recounts its run too


@admin.register(DryRun)
class DryRunAdmin(VisibleAdminMixin, admin.ModelAdmin):
    list_display = ("id", "owner", "script_version", "status", "created_at", "finished_at")
    list_filter = ("status",)


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    """Quotas per user or per group (training.services.quotas). A user's limit of each quota is their own
    row's, else the most generous of their groups' rows', else the deployment's default (ARTWEB_QUOTA_*);
    an empty field is not set by the row, 0 is no limit. The share weight (the fair queue's, no limit) is the
    user's row's, else the largest of their groups', else 1. A user's row shows what they use now."""

    list_display = (
        "holder",
        "trajectory_mb",
        "concurrent_runs",
        "steps_per_day",
        "gpu_hours_per_day",
        "attachment_mb",
        "share_weight",
        "usage",
        "note",
        "updated_at",
    )
    list_select_related = ("user", "group")
    search_fields = ("user__username", "group__name", "note")
    autocomplete_fields = ("user", "group")
    fields = (
        "user",
        "group",
        "trajectory_mb",
        "concurrent_runs",
        "steps_per_day",
        "gpu_hours_per_day",
        "attachment_mb",
        "share_weight",
        "note",
        "effective",
        "updated_at",
    )
    readonly_fields = ("effective", "updated_at")

    @admin.display(description="user or group")
    def holder(self, obj):
        return obj.user.get_username() if obj.user_id else f"group {obj.group.name}"

    @admin.display(description="usage now")
    def usage(self, obj):
        if not obj.user_id:
            return f"{obj.group.user_set.count()} member(s)"
        return "; ".join(f"{q.used_text} of {q.limit_text}" for q in quota_status(user=obj.user))

    @admin.display(description="in effect for this user")
    def effective(self, obj):
        if obj is None or not obj.user_id:
            return "Each member's limits: their own row's, else the most generous group's, else the default."
        weight, source = share_weights(user_ids=[obj.user_id])[obj.user_id]
        return format_html_join(
            "",
            "<p>{}: {} of {} <span class='help'>({})</span></p>",
            ((q.label, q.used_text, q.limit_text, q.source) for q in quota_status(user=obj.user)),
        ) + format_html("<p>Share weight: {} <span class='help'>({})</span></p>", f"{weight:g}", source)
