"""Checkpoints: list a run's, download one as .tar.gz, promote, delete (files go, the row stays)."""

from __future__ import annotations

from pathlib import Path

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from artweb.api import Api, WriteApi, stream_response
from artweb.api_errors import ErrorSerializer
from training import selectors
from training.models import Checkpoint
from training.services import checkpoints as services

ERRORS = {400: ErrorSerializer, 404: ErrorSerializer}
FILE_CHUNK_BYTES = 256 * 1024


class CheckpointOutput(serializers.Serializer):
    id = serializers.IntegerField()
    run_id = serializers.IntegerField()
    step = serializers.IntegerField()
    size_bytes = serializers.IntegerField()
    metrics = serializers.JSONField()
    val_reward = serializers.FloatField(allow_null=True)
    state = serializers.ChoiceField(choices=Checkpoint.State.choices)
    promoted = serializers.BooleanField()
    created_at = serializers.DateTimeField()
    deleted_at = serializers.DateTimeField(allow_null=True)


class CheckpointListApi(Api):
    class OutputSerializer(serializers.Serializer):
        results = CheckpointOutput(many=True)

    @extend_schema(operation_id="runs_checkpoints_list", responses={200: OutputSerializer, 404: ErrorSerializer})
    def get(self, request, run_id: int):
        run = selectors.run_get(user=request.user, run_id=run_id)
        return Response(self.OutputSerializer({"results": selectors.checkpoint_list(run=run)}).data)


def _file_chunks(path: Path):
    with path.open("rb") as fh:
        while chunk := fh.read(FILE_CHUNK_BYTES):
            yield chunk


class CheckpointDownloadApi(Api):
    """The checkpoint's LoRA adapter (config and weights) as a .tar.gz."""

    @extend_schema(
        operation_id="checkpoints_download",
        responses={(200, "application/gzip"): OpenApiResponse(OpenApiTypes.BINARY), **ERRORS},
    )
    def get(self, request, checkpoint_id: int):
        checkpoint = selectors.checkpoint_get(user=request.user, checkpoint_id=checkpoint_id)
        path = services.checkpoint_archive(checkpoint=checkpoint)
        return stream_response(
            request, _file_chunks(path), content_type="application/gzip", filename=path.name, length=path.stat().st_size
        )


class CheckpointPromoteApi(WriteApi):
    """Mark the checkpoint as the run's chosen one (kept by retention)."""

    @extend_schema(operation_id="checkpoints_promote", request=None, responses={200: CheckpointOutput, **ERRORS})
    def post(self, request, checkpoint_id: int):
        checkpoint = selectors.checkpoint_get(user=request.user, checkpoint_id=checkpoint_id)
        return Response(CheckpointOutput(services.checkpoint_promote(checkpoint=checkpoint, actor=request.user)).data)


class CheckpointDeleteApi(WriteApi):
    """Delete the checkpoint's files; the row stays, marked deleted. Refused while a run needs it."""

    @extend_schema(operation_id="checkpoints_delete", request=None, responses={200: CheckpointOutput, **ERRORS})
    def post(self, request, checkpoint_id: int):
        checkpoint = selectors.checkpoint_get(user=request.user, checkpoint_id=checkpoint_id)
        return Response(CheckpointOutput(services.checkpoint_delete(checkpoint=checkpoint, actor=request.user)).data)
