"""Dry runs: try a script (and reward) on a few scenarios against the live base model, then poll."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from artweb.api import MAX_INT, Api, WriteApi, body
from artweb.api_errors import ErrorSerializer
from training import selectors
from training.apis.common import (
    IdOrNameField,
    RefOutput,
    VersionRefOutput,
    resolve_base_model,
    resolve_reward_version,
    resolve_scenario_set,
    resolve_script_version,
)
from training.config import MAX_ATTACHMENTS
from training.models import DryRun
from training.services import dry_runs as dry_runs_service


class DryRunOutput(serializers.Serializer):
    id = serializers.IntegerField()
    status = serializers.ChoiceField(choices=DryRun.Status.choices)
    script = VersionRefOutput(source="script_version")
    reward = VersionRefOutput(source="reward_version", allow_null=True)
    base_model = RefOutput()
    scenarios = serializers.JSONField()
    samples = serializers.IntegerField(help_text="Rollouts per scenario.")
    attachments = serializers.ListField(
        child=serializers.CharField(), help_text="Names of your data attachments bound at /data/<name>."
    )
    result = serializers.JSONField(
        allow_null=True,
        help_text=(
            'Trajectories with rewards, logs and errors, and under "spread" per scenario its rewards, their std, '
            "min and max and whether they differ (signal), with a verdict for the whole sample."
        ),
    )
    error = serializers.CharField()
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)


class DryRunCreateApi(WriteApi):
    """Queue a dry run; poll GET /dry-runs/{id}/ until status is done or failed."""

    class InputSerializer(serializers.Serializer):
        script = IdOrNameField(help_text="Rollout script id or name.")
        script_version = serializers.IntegerField(required=False, min_value=1, max_value=MAX_INT)
        reward = IdOrNameField(required=False, allow_null=True, default=None)
        reward_version = serializers.IntegerField(required=False, min_value=1, max_value=MAX_INT)
        base_model = IdOrNameField()
        scenario_set = IdOrNameField(
            required=False, allow_null=True, default=None, help_text="Try the first scenarios of this set..."
        )
        scenario_count = serializers.IntegerField(
            required=False,
            min_value=1,
            max_value=dry_runs_service.MAX_DRY_RUN_SCENARIOS,
            default=dry_runs_service.DEFAULT_DRY_RUN_SCENARIOS,
            help_text="...this many of them...",
        )
        scenarios = serializers.ListField(
            child=serializers.DictField(),
            required=False,
            allow_null=True,
            default=None,
            min_length=1,
            max_length=dry_runs_service.MAX_DRY_RUN_SCENARIOS,
            help_text="...or these scenario objects.",
        )
        samples = serializers.IntegerField(
            required=False,
            min_value=1,
            max_value=dry_runs_service.MAX_DRY_RUN_SAMPLES,
            default=1,
            help_text="Rollouts per scenario, scored as one group: with 2 or more the result says whether the "
            "reward gives spread (different rewards within a scenario), the signal GRPO learns from.",
        )
        attachments = serializers.ListField(
            child=serializers.CharField(max_length=100),
            required=False,
            default=list,
            max_length=MAX_ATTACHMENTS,
            help_text="Names of your data attachments the script and reward read, each at /data/<name> in the "
            "sandbox, read-only, as a run's attachments are.",
        )

    @extend_schema(
        operation_id="dry_runs_create", request=InputSerializer, responses={201: DryRunOutput, 400: ErrorSerializer}
    )
    def post(self, request):
        data = body(self.InputSerializer, request)
        user = request.user
        dry_run = dry_runs_service.dry_run_create(
            owner=user,
            script_version=resolve_script_version(user, data["script"], data.get("script_version")),
            reward_version=resolve_reward_version(user, data["reward"], data.get("reward_version")),
            base_model=resolve_base_model(user, data["base_model"]),
            scenario_set=resolve_scenario_set(user, data["scenario_set"]),
            scenarios=data["scenarios"],
            scenario_count=data["scenario_count"],
            samples=data["samples"],
            attachments=data["attachments"],
        )
        return Response(DryRunOutput(dry_run).data, status=201)


class DryRunDetailApi(Api):
    @extend_schema(operation_id="dry_runs_retrieve", responses={200: DryRunOutput, 404: ErrorSerializer})
    def get(self, request, dry_run_id: int):
        return Response(DryRunOutput(selectors.dry_run_get(user=request.user, dry_run_id=dry_run_id)).data)
