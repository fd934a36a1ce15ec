"""Export targets: where your runs are mirrored (Weights & Biases, Weave, Langfuse). List, create, show,
change, send a test event, delete. Only your own: someone else's target answers 404.

The key (API key / secret key) is write-only: answers show its last four characters at most. Changing
a target without a `secret` keeps the stored key; `"secret": ""` removes it.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from artweb.api import MAX_ID, Api, WriteApi, body, query_params
from artweb.api_errors import ErrorSerializer
from artweb.errors import ApplicationError
from training.exports import services
from training.exports.schemas import SCHEMAS
from training.exports.selectors import export_target_get, export_target_list, export_target_public
from training.models import ExportTarget
from training.selectors import run_visible

ERRORS = {400: ErrorSerializer, 404: ErrorSerializer}
SETTINGS_HELP = (
    "The kind's settings, whole (missing ones take their defaults). W&B: project, entity, base_url, "
    "mode, trajectories_per_step, log_checkpoints. Weave: project (entity/project), base_url. "
    "Langfuse: host, public_key, include_validation. GET /api/v1/export-targets/kinds/ describes them."
)


class ExportTargetOutput(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=ExportTarget.Kind.choices)
    run = serializers.IntegerField(allow_null=True, help_text="The run it applies to; null: all your runs.")
    enabled = serializers.BooleanField()
    settings = serializers.JSONField()
    secret = serializers.CharField(help_text="The stored key masked to its last four characters; empty: none.")
    secret_source = serializers.ChoiceField(
        choices=["stored", "worker environment", "none"],
        help_text="Where the key comes from. 'worker environment' only for staff members' targets.",
    )
    last_error = serializers.CharField()
    last_error_at = serializers.DateTimeField(allow_null=True)
    last_success_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


def _out(target: ExportTarget) -> dict:
    return ExportTargetOutput(export_target_public(target)).data


def _run(user, run_id: int | None):
    """A run the user may see, or an error on the `run` field (any other reads as not found)."""
    if run_id is None:
        return None
    run = run_visible(user).filter(id=run_id).first()
    if run is None:
        raise ApplicationError(
            f"No run {run_id} among yours. Give the id of one of your runs "
            "(GET /api/v1/runs/), or leave `run` out for all your runs.",
            field_errors={"run": ["not found"]},
        )
    return run


class ExportTargetListApi(Api):
    """Your export targets: those for all your runs and those for single runs."""

    class FilterSerializer(serializers.Serializer):
        run = serializers.IntegerField(
            required=False, min_value=1, max_value=MAX_ID, help_text="Only the targets of this run."
        )

    class OutputSerializer(serializers.Serializer):
        results = ExportTargetOutput(many=True)

    @extend_schema(
        operation_id="export_targets_list",
        parameters=[FilterSerializer],
        responses={200: OutputSerializer, 400: ErrorSerializer},
    )
    def get(self, request):
        f = query_params(self.FilterSerializer, request)
        targets = export_target_list(owner=request.user, run=_run(request.user, f.get("run")))
        return Response({"results": [_out(t) for t in targets]})


class ExportTargetKindListApi(Api):
    """The kinds of target and their settings: name, type, default, bounds and description (JSON Schema)."""

    class OutputSerializer(serializers.Serializer):
        class KindSerializer(serializers.Serializer):
            kind = serializers.CharField()
            label = serializers.CharField()
            settings_schema = serializers.JSONField(help_text="JSON Schema of the kind's settings.")

        results = KindSerializer(many=True)

    @extend_schema(operation_id="export_targets_kinds", responses={200: OutputSerializer})
    def get(self, request):
        return Response(
            {
                "results": [
                    {
                        "kind": kind,
                        "label": ExportTarget.Kind(kind).label,
                        "settings_schema": schema.model_json_schema(),
                    }
                    for kind, schema in SCHEMAS.items()
                ]
            }
        )


class ExportTargetCreateApi(WriteApi):
    """Add a target for all your runs (no `run`) or for one run (it overrides the all-runs one of its kind)."""

    class InputSerializer(serializers.Serializer):
        kind = serializers.ChoiceField(
            choices=ExportTarget.Kind.choices,
            error_messages={
                "invalid_choice": f'"{{input}}" is not a kind of export; choose {", ".join(ExportTarget.Kind.values)}.'
            },
        )
        run = serializers.IntegerField(
            required=False,
            allow_null=True,
            default=None,
            min_value=1,
            max_value=MAX_ID,
            help_text="A run of yours; leave out for all your runs.",
        )
        settings = serializers.DictField(required=False, default=dict, help_text=SETTINGS_HELP)
        secret = serializers.CharField(
            required=False,
            allow_blank=True,
            default="",
            max_length=1000,
            trim_whitespace=True,
            write_only=True,
            help_text="W&B / Weave: your W&B API key. Langfuse: your secret key. Stored encrypted, never shown again.",
        )
        enabled = serializers.BooleanField(required=False, default=True)

    @extend_schema(
        operation_id="export_targets_create", request=InputSerializer, responses={201: ExportTargetOutput, **ERRORS}
    )
    def post(self, request):
        data = body(self.InputSerializer, request)
        target = services.export_target_create(
            owner=request.user,
            kind=data["kind"],
            settings=data["settings"],
            secret=data["secret"],
            run=_run(request.user, data["run"]),
            enabled=data["enabled"],
        )
        return Response(_out(target), status=201)


class ExportTargetDetailApi(Api):
    @extend_schema(operation_id="export_targets_retrieve", responses={200: ExportTargetOutput, 404: ErrorSerializer})
    def get(self, request, target_id: int):
        return Response(_out(export_target_get(user=request.user, target_id=target_id)))


class ExportTargetUpdateApi(WriteApi):
    """Change settings, key or enabled. What you leave out stays as it is; settings, when given, are whole."""

    class InputSerializer(serializers.Serializer):
        settings = serializers.DictField(required=False, help_text=SETTINGS_HELP)
        secret = serializers.CharField(
            required=False,
            allow_blank=True,
            allow_null=True,
            default=None,
            max_length=1000,
            trim_whitespace=True,
            write_only=True,
            help_text='A new key; leave out (or null) to keep the stored one, "" to remove it.',
        )
        enabled = serializers.BooleanField(required=False, allow_null=True, default=None)

    @extend_schema(
        operation_id="export_targets_update", request=InputSerializer, responses={200: ExportTargetOutput, **ERRORS}
    )
    def post(self, request, target_id: int):
        target = export_target_get(user=request.user, target_id=target_id)
        data = body(self.InputSerializer, request)
        target = services.export_target_update(
            target=target,
            actor=request.user,
            settings=data.get("settings"),
            secret=data["secret"],
            enabled=data["enabled"],
        )
        return Response(_out(target))


class ExportTargetTestApi(WriteApi):
    """Send one real test event to the target with its stored settings and key. A refusal is an answer
    (200 with ok false and the service's message), not an error of this request."""

    class OutputSerializer(serializers.Serializer):
        ok = serializers.BooleanField()
        message = serializers.CharField(help_text="What the service answered, or why nothing was sent.")
        target = ExportTargetOutput()

    @extend_schema(operation_id="export_targets_test", request=None, responses={200: OutputSerializer, **ERRORS})
    def post(self, request, target_id: int):
        target = export_target_get(user=request.user, target_id=target_id)
        result = services.export_target_test(target=target, actor=request.user)
        target.refresh_from_db()
        return Response({"ok": result.ok, "message": result.message, "target": _out(target)})


class ExportTargetDeleteApi(WriteApi):
    """Delete the target; runs are mirrored there no more (what was sent stays at the service)."""

    class OutputSerializer(serializers.Serializer):
        deleted = serializers.IntegerField(help_text="The id of the deleted target.")

    @extend_schema(operation_id="export_targets_delete", request=None, responses={200: OutputSerializer, **ERRORS})
    def post(self, request, target_id: int):
        target = export_target_get(user=request.user, target_id=target_id)
        services.export_target_delete(target=target, actor=request.user)
        return Response({"deleted": target_id})
