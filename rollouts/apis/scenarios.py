"""Scenario sets: JSONL upload, list, detail, and their scenarios page by page."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from artweb.api import (
    PAGE_PARAMETERS,
    Api,
    UploadApi,
    body,
    paginated_response,
    paginated_schema,
    query_params,
    upload_bytes,
)
from artweb.api_errors import ErrorSerializer
from artweb.errors import ApplicationError
from rollouts import selectors, services
from rollouts.models import Scenario

MAX_SCENARIO_BYTES = services.MAX_SCENARIO_BYTES


class ScenarioSetOutput(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    description = serializers.CharField()
    sha256 = serializers.CharField()
    train_count = serializers.IntegerField()
    validation_count = serializers.IntegerField()
    created_at = serializers.DateTimeField()


class ScenarioSetListApi(Api):
    class FilterSerializer(serializers.Serializer):
        name = serializers.CharField(required=False, max_length=200, help_text="Exact name.")

    @extend_schema(
        operation_id="scenario_sets_list",
        parameters=[FilterSerializer, *PAGE_PARAMETERS],
        responses={200: paginated_schema(ScenarioSetOutput, "PaginatedScenarioSetList")},
    )
    def get(self, request):
        filters = query_params(self.FilterSerializer, request)
        qs = selectors.scenario_set_list(user=request.user)
        if filters.get("name"):
            qs = qs.filter(name=filters["name"])
        return paginated_response(
            request=request, view=self, queryset=qs.order_by("-created_at", "-id"), serializer_class=ScenarioSetOutput
        )


class ScenarioSetCreateApi(UploadApi):
    max_upload_bytes = MAX_SCENARIO_BYTES
    max_json_bytes = MAX_SCENARIO_BYTES + MAX_SCENARIO_BYTES // 2

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=200)
        description = serializers.CharField(required=False, allow_blank=True, max_length=5000, default="")
        validation_fraction = serializers.FloatField(
            required=False,
            default=0.2,
            min_value=0.0,
            max_value=0.99,
            help_text='Share of lines without a "split" key held out for validation (seeded, reproducible).',
        )

    class JsonInputSerializer(InputSerializer):
        jsonl = serializers.CharField(trim_whitespace=False, help_text="One JSON object per line, UTF-8.")

    class FileInputSerializer(InputSerializer):
        file = serializers.FileField(help_text="A UTF-8 .jsonl file, one JSON object per line, at most 20 MiB.")

    @extend_schema(
        operation_id="scenario_sets_create",
        request={"application/json": JsonInputSerializer, "multipart/form-data": FileInputSerializer},
        responses={201: ScenarioSetOutput, 400: ErrorSerializer, 413: ErrorSerializer},
    )
    def post(self, request):
        data = body(self.InputSerializer, request)
        jsonl = request.data.get("jsonl")
        if jsonl is not None and not isinstance(jsonl, str):
            raise serializers.ValidationError({"jsonl": ["must be a string"]})
        raw = upload_bytes(
            file=request.FILES.get("file"), content=jsonl, max_bytes=MAX_SCENARIO_BYTES, what="scenario file"
        )
        if b"\\u0000" in raw:
            # json.loads turns the escape into a NUL character, which PostgreSQL's jsonb refuses.
            raise ApplicationError(
                "The scenario file contains \\u0000 (NUL) characters; remove them.",
                field_errors={"file": ["NUL character"]},
            )
        scenario_set = services.scenario_set_create(
            owner=request.user,
            name=data["name"],
            jsonl=raw,
            validation_fraction=data["validation_fraction"],
            description=data["description"],
        )
        return Response(ScenarioSetOutput(scenario_set).data, status=201)


class ScenarioSetDetailApi(Api):
    @extend_schema(operation_id="scenario_sets_retrieve", responses={200: ScenarioSetOutput, 404: ErrorSerializer})
    def get(self, request, scenario_set_id: int):
        scenario_set = selectors.scenario_set_get(user=request.user, scenario_set_id=scenario_set_id)
        return Response(ScenarioSetOutput(scenario_set).data)


class ScenarioListApi(Api):
    class FilterSerializer(serializers.Serializer):
        split = serializers.ChoiceField(choices=Scenario.Split.choices, required=False)

    class OutputSerializer(serializers.Serializer):
        id = serializers.IntegerField()
        index = serializers.IntegerField()
        split = serializers.CharField()
        data = serializers.JSONField()

    @extend_schema(
        operation_id="scenario_sets_scenarios_list",
        parameters=[FilterSerializer, *PAGE_PARAMETERS],
        responses={200: paginated_schema(OutputSerializer, "PaginatedScenarioList"), 404: ErrorSerializer},
    )
    def get(self, request, scenario_set_id: int):
        scenario_set = selectors.scenario_set_get(user=request.user, scenario_set_id=scenario_set_id)
        filters = query_params(self.FilterSerializer, request)
        qs = scenario_set.scenarios.order_by("index")
        if filters.get("split"):
            qs = qs.filter(split=filters["split"])
        return paginated_response(request=request, view=self, queryset=qs, serializer_class=self.OutputSerializer)
