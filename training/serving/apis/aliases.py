"""Checkpoint aliases (training.serving.services.aliases), by the REST API's conventions."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from artweb.api import WriteApi
from artweb.api_errors import ErrorSerializer
from training import selectors
from training.serving.services.aliases import checkpoint_alias_delete, checkpoint_alias_set


def _valid(serializer_class, data) -> dict:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


class AliasOutput(serializers.Serializer):
    name = serializers.CharField()
    checkpoint = serializers.IntegerField(source="checkpoint_id")
    run = serializers.IntegerField(source="checkpoint.run_id")
    step = serializers.IntegerField(source="checkpoint.step")


class CheckpointAliasApi(WriteApi):
    """Give one of your checkpoints a name the OpenAI endpoint answers to (promotes it), or take it away."""

    class InputSerializer(serializers.Serializer):
        alias = serializers.CharField(max_length=100, help_text="Letters, digits, '.', '_' and '-'; no '@'.")

    @extend_schema(
        operation_id="checkpoints_alias",
        request=InputSerializer,
        responses={200: AliasOutput, 400: ErrorSerializer, 404: ErrorSerializer},
    )
    def post(self, request, checkpoint_id: int):
        checkpoint = selectors.checkpoint_get(user=request.user, checkpoint_id=checkpoint_id)
        data = _valid(self.InputSerializer, request.data)
        alias = checkpoint_alias_set(checkpoint=checkpoint, name=data["alias"], actor=request.user)
        return Response(AliasOutput(alias).data)


class CheckpointAliasDeleteApi(WriteApi):
    class InputSerializer(serializers.Serializer):
        alias = serializers.CharField(max_length=100)

    @extend_schema(
        operation_id="checkpoints_alias_delete", request=InputSerializer, responses={204: None, 404: ErrorSerializer}
    )
    def post(self, request, checkpoint_id: int):
        checkpoint = selectors.checkpoint_get(user=request.user, checkpoint_id=checkpoint_id)
        data = _valid(self.InputSerializer, request.data)
        checkpoint_alias_delete(checkpoint=checkpoint, name=data["alias"], actor=request.user)
        return Response(status=204)
