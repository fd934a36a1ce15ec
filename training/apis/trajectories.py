"""A run's trajectory groups and trajectories: keyset-paged lists, details, and a streamed JSONL export."""

from __future__ import annotations

import json

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from artweb.api import MAX_INT, Api, FiniteFloatField, keyset_page, query_params, stream_response
from artweb.api_errors import ErrorSerializer
from training import selectors
from training.models import TrajectoryGroup

ERRORS = {400: ErrorSerializer, 404: ErrorSerializer}
EXPORT_CHUNK_ROWS = 500


class GroupOutput(serializers.Serializer):
    id = serializers.IntegerField()
    step = serializers.IntegerField()
    split = serializers.ChoiceField(choices=TrajectoryGroup.Split.choices)
    scenario_id = serializers.IntegerField()
    scenario_index = serializers.IntegerField(source="scenario.index")
    reward_mean = serializers.FloatField(allow_null=True)
    reward_std = serializers.FloatField(allow_null=True)
    error_count = serializers.IntegerField()
    skipped = serializers.BooleanField()
    failed_attempt = serializers.BooleanField(help_text="From an attempt at the step that failed: never trained on.")
    created_at = serializers.DateTimeField()


class TrajectoryOutput(serializers.Serializer):
    id = serializers.IntegerField()
    group_id = serializers.IntegerField()
    failed_attempt = serializers.BooleanField(
        source="group.failed_attempt", help_text="From an attempt at the step that failed: never trained on."
    )
    step = serializers.IntegerField()
    index = serializers.IntegerField()
    reward = serializers.FloatField(allow_null=True)
    advantage = serializers.FloatField(allow_null=True)
    messages = serializers.JSONField()
    metrics = serializers.JSONField()
    error = serializers.CharField()
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    duration_ms = serializers.IntegerField()


class TrajectoryDetailOutput(TrajectoryOutput):
    tools = serializers.JSONField(allow_null=True)
    additional_histories = serializers.JSONField(
        help_text="ART's additional histories: conversations beside the main one ({messages, tools} each), "
        "trained with the trajectory's advantage."
    )
    metadata = serializers.JSONField()
    logs = serializers.JSONField()


class TrajectoryFilterSerializer(serializers.Serializer):
    step = serializers.IntegerField(required=False, min_value=0, max_value=MAX_INT)
    split = serializers.ChoiceField(choices=TrajectoryGroup.Split.choices, required=False)
    min_reward = FiniteFloatField(required=False)
    max_reward = FiniteFloatField(required=False)
    q = serializers.CharField(required=False, max_length=200, help_text="Text in the messages (case-insensitive).")
    has_error = serializers.BooleanField(required=False, allow_null=True, default=None)


def _trajectories(run, f: dict):
    return selectors.trajectory_list(
        run=run,
        step=f.get("step"),
        split=f.get("split"),
        min_reward=f.get("min_reward"),
        max_reward=f.get("max_reward"),
        q=f.get("q"),
        has_error=f.get("has_error"),
    )


class GroupListApi(Api):
    class FilterSerializer(serializers.Serializer):
        step = serializers.IntegerField(required=False, min_value=0, max_value=MAX_INT)
        split = serializers.ChoiceField(choices=TrajectoryGroup.Split.choices, required=False)
        cursor = serializers.CharField(required=False, max_length=200)
        limit = serializers.IntegerField(required=False, min_value=1, max_value=500, default=100)

    class OutputSerializer(serializers.Serializer):
        results = GroupOutput(many=True)
        next_cursor = serializers.CharField(allow_null=True, help_text="Pass as cursor for the next page.")

    @extend_schema(
        operation_id="runs_groups_list", parameters=[FilterSerializer], responses={200: OutputSerializer, **ERRORS}
    )
    def get(self, request, run_id: int):
        run = selectors.run_get(user=request.user, run_id=run_id)
        f = query_params(self.FilterSerializer, request)
        qs = selectors.group_list(run=run, step=f.get("step"), split=f.get("split"))
        rows, next_cursor = keyset_page(
            qs, keys=("step", "id"), columns=("step", "id"), cursor=f.get("cursor"), limit=f["limit"]
        )
        return Response(self.OutputSerializer({"results": rows, "next_cursor": next_cursor}).data)


class GroupDetailApi(Api):
    class OutputSerializer(GroupOutput):
        scenario = serializers.JSONField(source="scenario.data")
        trajectories = TrajectoryOutput(many=True)

    @extend_schema(operation_id="runs_groups_retrieve", responses={200: OutputSerializer, 404: ErrorSerializer})
    def get(self, request, run_id: int, group_id: int):
        run = selectors.run_get(user=request.user, run_id=run_id)
        group = selectors.group_get(run=run, group_id=group_id)
        return Response(self.OutputSerializer(group).data)


class TrajectoryListApi(Api):
    """Trajectories in (step, group, index) order, a page at a time.

    Pages are keyset-paged: pass next_cursor from one answer as cursor in the next. Any page costs
    the same, however deep; there is no total count (use the export for everything).
    """

    class FilterSerializer(TrajectoryFilterSerializer):
        cursor = serializers.CharField(required=False, max_length=200)
        limit = serializers.IntegerField(required=False, min_value=1, max_value=200, default=50)

    class OutputSerializer(serializers.Serializer):
        results = TrajectoryOutput(many=True)
        next_cursor = serializers.CharField(allow_null=True, help_text="Pass as cursor for the next page.")

    @extend_schema(
        operation_id="runs_trajectories_list",
        parameters=[FilterSerializer],
        responses={200: OutputSerializer, **ERRORS},
    )
    def get(self, request, run_id: int):
        run = selectors.run_get(user=request.user, run_id=run_id)
        f = query_params(self.FilterSerializer, request)
        qs = _trajectories(run, f).defer("logs", "metadata", "tools", "search_text")
        rows, next_cursor = keyset_page(
            qs,
            keys=("step", "group_id", "index"),
            columns=("step", "group_id", "index"),
            cursor=f.get("cursor"),
            limit=f["limit"],
        )
        return Response(self.OutputSerializer({"results": rows, "next_cursor": next_cursor}).data)


class TrajectoryDetailApi(Api):
    @extend_schema(
        operation_id="runs_trajectories_retrieve", responses={200: TrajectoryDetailOutput, 404: ErrorSerializer}
    )
    def get(self, request, run_id: int, trajectory_id: int):
        run = selectors.run_get(user=request.user, run_id=run_id)
        return Response(TrajectoryDetailOutput(selectors.trajectory_get(run=run, trajectory_id=trajectory_id)).data)


EXPORT_FIELDS = (
    "id",
    "group_id",
    "step",
    "index",
    "reward",
    "advantage",
    "messages",
    "tools",
    "additional_histories",
    "metrics",
    "metadata",
    "logs",
    "error",
    "prompt_tokens",
    "completion_tokens",
    "duration_ms",
)


def _export_chunks(qs):
    """JSONL bytes, EXPORT_CHUNK_ROWS trajectories at a time, keyset-paged so memory stays flat."""
    cursor = None
    while True:
        rows, cursor = keyset_page(
            qs,
            keys=("step", "group_id", "index"),
            columns=("step", "group_id", "index"),
            cursor=cursor,
            limit=EXPORT_CHUNK_ROWS,
        )
        if rows:
            yield "".join(
                json.dumps({f: getattr(r, f) for f in EXPORT_FIELDS}, ensure_ascii=False) + "\n" for r in rows
            ).encode("utf-8")
        if cursor is None:
            return


class TrajectoryExportApi(Api):
    """Every trajectory matching the filters as JSON Lines, streamed (one object per line)."""

    @extend_schema(
        operation_id="runs_trajectories_export",
        parameters=[TrajectoryFilterSerializer],
        responses={(200, "application/x-ndjson"): OpenApiResponse(OpenApiTypes.BINARY), **ERRORS},
    )
    def get(self, request, run_id: int):
        run = selectors.run_get(user=request.user, run_id=run_id)
        f = query_params(TrajectoryFilterSerializer, request)
        qs = _trajectories(run, f).only(*[name for name in EXPORT_FIELDS if name != "group_id"], "group")
        return stream_response(
            request, _export_chunks(qs), content_type="application/x-ndjson", filename=f"run{run.id}-trajectories.jsonl"
        )
