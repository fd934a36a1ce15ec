"""RULER judge endpoints: OpenAI-compatible servers elsewhere that your RULER runs may use as their judge
(`ruler_judge: "endpoint:<name>"`). List, create, show, change, delete; only your own, staff too
(someone else's answers 404: a setting, artweb.visibility.own). The key is write-only: answers show its last four characters at most. Changing an
endpoint without `api_key` keeps the stored key; `"api_key": ""` removes it.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from artweb.api import Api, WriteApi, body
from artweb.api_errors import ErrorSerializer
from training.exports.crypto import secret_mask
from training.models import JudgeEndpoint
from training.selectors import judge_endpoint_get, judge_endpoint_list
from training.services import judges

ERRORS = {400: ErrorSerializer, 404: ErrorSerializer}


class JudgeEndpointOutput(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    ruler_judge = serializers.SerializerMethodField(help_text="The value a run's ruler_judge takes to use it.")
    base_url = serializers.CharField()
    model = serializers.CharField()
    api_key = serializers.SerializerMethodField(
        help_text="The stored key, masked to its last four characters (long keys only); empty: none stored."
    )
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def get_ruler_judge(self, obj) -> str:
        return f"{judges.ENDPOINT_PREFIX}{obj.name}"

    def get_api_key(self, obj) -> str:
        return secret_mask(obj.key_last4) if obj.key_encrypted else ""


def _own(request, endpoint_id: int) -> JudgeEndpoint:
    return judge_endpoint_get(user=request.user, endpoint_id=endpoint_id)


class JudgeEndpointListApi(Api):
    @extend_schema(operation_id="judges_list", responses={200: JudgeEndpointOutput(many=True)})
    def get(self, request):
        return Response(JudgeEndpointOutput(judge_endpoint_list(owner=request.user), many=True).data)


class JudgeEndpointCreateApi(WriteApi):
    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=100, help_text="Runs refer to it as endpoint:<name>.")
        base_url = serializers.CharField(
            max_length=500, help_text="OpenAI-compatible base URL, e.g. https://api.example.com/v1 (public hosts only)."
        )
        model = serializers.CharField(max_length=200, help_text="The judge model's name at that server.")
        api_key = serializers.CharField(
            required=False,
            allow_blank=True,
            default="",
            max_length=1000,
            write_only=True,
            help_text="Sent as a bearer token; never shown again.",
        )

    @extend_schema(
        operation_id="judges_create", request=InputSerializer, responses={201: JudgeEndpointOutput, **ERRORS}
    )
    def post(self, request):
        data = body(self.InputSerializer, request)
        endpoint = judges.judge_endpoint_create(owner=request.user, **data)
        return Response(JudgeEndpointOutput(endpoint).data, status=201)


class JudgeEndpointDetailApi(Api):
    @extend_schema(operation_id="judges_retrieve", responses={200: JudgeEndpointOutput, 404: ErrorSerializer})
    def get(self, request, endpoint_id: int):
        return Response(JudgeEndpointOutput(_own(request, endpoint_id)).data)


class JudgeEndpointUpdateApi(WriteApi):
    """Change the URL, the model or the key; what you leave out stays as it is."""

    class InputSerializer(serializers.Serializer):
        base_url = serializers.CharField(required=False, max_length=500, default=None)
        model = serializers.CharField(required=False, max_length=200, default=None)
        api_key = serializers.CharField(
            required=False,
            allow_blank=True,
            allow_null=True,
            default=None,
            max_length=1000,
            write_only=True,
            help_text='A new key; leave out to keep the stored one, "" to remove it.',
        )

    @extend_schema(
        operation_id="judges_update", request=InputSerializer, responses={200: JudgeEndpointOutput, **ERRORS}
    )
    def post(self, request, endpoint_id: int):
        endpoint = _own(request, endpoint_id)
        data = body(self.InputSerializer, request)
        endpoint = judges.judge_endpoint_update(endpoint=endpoint, **data)
        return Response(JudgeEndpointOutput(endpoint).data)


class JudgeEndpointDeleteApi(WriteApi):
    class OutputSerializer(serializers.Serializer):
        deleted = serializers.IntegerField()

    @extend_schema(operation_id="judges_delete", request=None, responses={200: OutputSerializer, **ERRORS})
    def post(self, request, endpoint_id: int):
        judges.judge_endpoint_delete(endpoint=_own(request, endpoint_id))
        return Response({"deleted": endpoint_id})
