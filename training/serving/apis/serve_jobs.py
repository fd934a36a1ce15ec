"""Playground sessions and answer diffs (training.serving.services.serve_jobs): queue one, then poll it."""

from __future__ import annotations

import json

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from artweb.api import PAGE_PARAMETERS, Api, WriteApi, body, paginated_response, paginated_schema
from artweb.api_errors import ErrorSerializer
from rollouts.selectors import scenario_list
from training.apis.common import IdOrNameField, resolve_reward_version, resolve_scenario_set
from training.serving import selectors
from training.serving.models import ServeJob
from training.serving.services import serve_jobs as services

ERRORS = {400: ErrorSerializer, 404: ErrorSerializer}


class JobOutput(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.CharField()
    status = serializers.CharField()
    models = serializers.ListField(source="model_names", child=serializers.CharField())
    scenario_set = serializers.IntegerField(source="scenario_set_id", allow_null=True)
    reward_version = serializers.IntegerField(source="reward_version_id", allow_null=True)
    params = serializers.JSONField()
    progress_done = serializers.IntegerField()
    progress_total = serializers.IntegerField()
    result = serializers.JSONField(help_text="Playground: messages and one column per model. Diff: the summary.")
    error = serializers.CharField()
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)


def _reward(user, data):
    if data.get("reward") is None:
        return None
    return resolve_reward_version(user, data["reward"], data.get("reward_version"))


class PlaygroundCreateApi(WriteApi):
    """One prompt (or a scenario) answered by up to four models, `samples` answers each, optionally scored."""

    class InputSerializer(serializers.Serializer):
        models = serializers.ListField(child=serializers.CharField(max_length=300), min_length=1, max_length=4)
        prompt = serializers.CharField(required=False, allow_blank=True, default="", max_length=20000)
        system = serializers.CharField(required=False, allow_blank=True, default="", max_length=20000)
        scenario = serializers.IntegerField(required=False, allow_null=True, default=None, help_text="A scenario id.")
        tools = serializers.ListField(child=serializers.DictField(), required=False, allow_null=True, default=None)
        tool_choice = serializers.CharField(
            required=False, default="auto", max_length=200, help_text="auto, required, none, or a tool's name."
        )
        reward = IdOrNameField(required=False, allow_null=True, default=None, help_text="Reward function id or name.")
        reward_version = serializers.IntegerField(required=False, min_value=1)
        samples = serializers.IntegerField(required=False, default=2)
        temperature = serializers.FloatField(required=False, default=1.0)
        max_tokens = serializers.IntegerField(required=False, default=128)

    @extend_schema(operation_id="playground_create", request=InputSerializer, responses={201: JobOutput, **ERRORS})
    def post(self, request):
        data = body(self.InputSerializer, request)
        user = request.user
        scenario = None
        if data["scenario"] is not None:
            scenario = scenario_list(user=user).filter(id=data["scenario"]).first()
            if scenario is None:
                return Response({"message": "That scenario does not exist.", "field_errors": {}}, status=404)
        job = services.playground_create(
            user=user,
            models=data["models"],
            prompt=data["prompt"],
            system=data["system"],
            scenario=scenario,
            tools=data["tools"],
            tool_choice=data["tool_choice"],
            reward_version=_reward(user, data),
            samples=data["samples"],
            temperature=data["temperature"],
            max_tokens=data["max_tokens"],
        )
        return Response(JobOutput(job).data, status=201)


class PlaygroundDetailApi(Api):
    @extend_schema(operation_id="playground_retrieve", responses={200: JobOutput, 404: ErrorSerializer})
    def get(self, request, job_id: int):
        return Response(
            JobOutput(selectors.serve_job_get(user=request.user, job_id=job_id, kind=ServeJob.Kind.PLAYGROUND)).data
        )


class DiffListApi(Api):
    class OutputSerializer(serializers.Serializer):
        results = JobOutput(many=True)

    @extend_schema(operation_id="diffs_list", responses={200: OutputSerializer})
    def get(self, request):
        jobs = selectors.serve_job_list(user=request.user, kind=ServeJob.Kind.DIFF)[:200]
        return Response(self.OutputSerializer({"results": jobs}).data)


class DiffCreateApi(WriteApi):
    """Queue an answer diff: the held-out scenarios of a set answered by model_a and model_b, scored."""

    class InputSerializer(serializers.Serializer):
        model_a = serializers.CharField(max_length=300, help_text="A base model, <run>@<step|best|latest> or an alias.")
        model_b = serializers.CharField(max_length=300)
        scenario_set = IdOrNameField(help_text="Scenario set id or name; its held-out (validation) split is used.")
        reward = IdOrNameField(help_text="Reward function id or name.")
        reward_version = serializers.IntegerField(required=False, min_value=1)
        samples = serializers.IntegerField(required=False, default=4)
        temperature = serializers.FloatField(required=False, default=1.0)
        max_tokens = serializers.IntegerField(required=False, default=128)
        max_scenarios = serializers.IntegerField(required=False, default=50)
        system = serializers.CharField(required=False, allow_blank=True, default="", max_length=20000)
        seed = serializers.IntegerField(required=False, default=0)

    @extend_schema(operation_id="diffs_create", request=InputSerializer, responses={201: JobOutput, **ERRORS})
    def post(self, request):
        data = body(self.InputSerializer, request)
        user = request.user
        job = services.diff_create(
            user=user,
            model_a=data["model_a"],
            model_b=data["model_b"],
            scenario_set=resolve_scenario_set(user, data["scenario_set"]),
            reward_version=_reward(user, data),
            samples=data["samples"],
            temperature=data["temperature"],
            max_tokens=data["max_tokens"],
            max_scenarios=data["max_scenarios"],
            system=data["system"],
            seed=data["seed"],
        )
        return Response(JobOutput(job).data, status=201)


class DiffDetailApi(Api):
    @extend_schema(operation_id="diffs_retrieve", responses={200: JobOutput, 404: ErrorSerializer})
    def get(self, request, job_id: int):
        return Response(
            JobOutput(selectors.serve_job_get(user=request.user, job_id=job_id, kind=ServeJob.Kind.DIFF)).data
        )


class DiffScenarioOutput(serializers.Serializer):
    scenario = serializers.IntegerField(source="scenario_id")
    index = serializers.IntegerField()
    reward_a = serializers.FloatField(allow_null=True)
    reward_b = serializers.FloatField(allow_null=True)
    delta = serializers.FloatField(allow_null=True)
    answers_a = serializers.JSONField()
    answers_b = serializers.JSONField()


class DiffScenarioListApi(Api):
    """Per scenario: each side's mean reward, the change (B - A), the answers; biggest change first."""

    @extend_schema(
        operation_id="diffs_scenarios",
        parameters=PAGE_PARAMETERS,
        responses={200: paginated_schema(DiffScenarioOutput, "DiffScenarioPage"), 404: ErrorSerializer},
    )
    def get(self, request, job_id: int):
        job = selectors.serve_job_get(user=request.user, job_id=job_id, kind=ServeJob.Kind.DIFF)
        return paginated_response(
            request=request, view=self, queryset=selectors.diff_scenarios(job=job), serializer_class=DiffScenarioOutput
        )


class DiffExportApi(Api):
    """The whole diff as a file: `?as=json` (default: the job, its summary and every scenario) or `?as=csv`."""

    @extend_schema(
        operation_id="diffs_export",
        parameters=[OpenApiParameter("as", str, enum=["json", "csv"])],
        responses={(200, "application/json"): OpenApiResponse(OpenApiTypes.BINARY), 404: ErrorSerializer},
    )
    def get(self, request, job_id: int):
        job = selectors.serve_job_get(user=request.user, job_id=job_id, kind=ServeJob.Kind.DIFF)
        kind = request.query_params.get("as", "json")
        if kind == "csv":
            response = HttpResponse(services.diff_export_csv(job=job), content_type="text/csv")
            response["Content-Disposition"] = f'attachment; filename="diff-{job.id}.csv"'
            return response
        if kind != "json":
            return Response({"message": "as must be json or csv.", "field_errors": {"as": ["json or csv"]}}, status=400)
        payload = {
            **JobOutput(job).data,
            "scenarios": [services.diff_row(r) for r in selectors.diff_scenarios(job=job)],
        }
        response = HttpResponse(json.dumps(payload, default=str), content_type="application/json")
        response["Content-Disposition"] = f'attachment; filename="diff-{job.id}.json"'
        return response
