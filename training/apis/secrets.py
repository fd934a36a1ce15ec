"""Secrets for your runs' tools (an API key): environment variables of the runs that name them in their
config's `secrets`. Write-only: no answer ever holds a value, only its last four characters (long values
only). List, set (create, or replace the value of the one of that name), delete; only your own, staff too.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from artweb.api import Api, WriteApi, body
from artweb.api_errors import ErrorSerializer
from training.services import tools

ERRORS = {400: ErrorSerializer, 404: ErrorSerializer}


class SecretOutput(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField(help_text="The environment variable a run's code reads it from.")
    value = serializers.SerializerMethodField(help_text="Masked: dots and, for long values, the last four characters.")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def get_value(self, obj) -> str:
        return tools.secret_mask_of(obj)


class SecretListApi(Api):
    @extend_schema(operation_id="secrets_list", responses={200: SecretOutput(many=True)})
    def get(self, request):
        return Response(SecretOutput(tools.secret_list(owner=request.user), many=True).data)


class SecretSetApi(WriteApi):
    """Store a secret, or replace the value of yours of that name."""

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=100, help_text="An environment variable name, e.g. SEARCH_API_KEY.")
        value = serializers.CharField(
            max_length=tools.MAX_SECRET_CHARS, write_only=True, trim_whitespace=False, help_text="Never shown again."
        )

    @extend_schema(operation_id="secrets_set", request=InputSerializer, responses={200: SecretOutput, **ERRORS})
    def post(self, request):
        data = body(self.InputSerializer, request)
        return Response(SecretOutput(tools.secret_set(owner=request.user, **data)).data)


class SecretDeleteApi(WriteApi):
    class OutputSerializer(serializers.Serializer):
        deleted = serializers.IntegerField()

    @extend_schema(operation_id="secrets_delete", request=None, responses={200: OutputSerializer, **ERRORS})
    def post(self, request, secret_id: int):
        tools.secret_delete(secret=tools.secret_get(owner=request.user, secret_id=secret_id))
        return Response({"deleted": secret_id})
