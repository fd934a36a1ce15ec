"""Data attachments: list, upload (a multipart file, streamed to disk), detail and delete."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from artweb.api import (
    PAGE_PARAMETERS,
    Api,
    UploadApi,
    WriteApi,
    body,
    paginated_response,
    paginated_schema,
    query_params,
)
from artweb.api_errors import ErrorSerializer
from artweb.errors import ApplicationError
from rollouts import attachments, selectors
from rollouts.sandbox.attachments import DATA_INSIDE, NAME_HELP


class AttachmentOutput(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    path = serializers.SerializerMethodField(help_text="Where the run's sandbox reads it.")
    description = serializers.CharField()
    sha256 = serializers.CharField()
    size = serializers.IntegerField(help_text="Bytes.")
    created_at = serializers.DateTimeField()

    def get_path(self, attachment) -> str:
        return f"{DATA_INSIDE}/{attachment.name}"


class AttachmentListApi(Api):
    class FilterSerializer(serializers.Serializer):
        name = serializers.CharField(required=False, max_length=100, help_text="Exact name.")

    @extend_schema(
        operation_id="attachments_list",
        parameters=[FilterSerializer, *PAGE_PARAMETERS],
        responses={200: paginated_schema(AttachmentOutput, "PaginatedAttachmentList")},
    )
    def get(self, request):
        filters = query_params(self.FilterSerializer, request)
        qs = selectors.attachment_list(user=request.user)
        if filters.get("name"):
            qs = qs.filter(name=filters["name"])
        return paginated_response(
            request=request, view=self, queryset=qs.order_by("name", "id"), serializer_class=AttachmentOutput
        )


class AttachmentCreateApi(UploadApi):
    """Multipart only: the file goes to a temporary file as it arrives, then through the hash to the store."""

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(
            required=False, allow_blank=True, max_length=100, default="", help_text=f"Default: the file's. {NAME_HELP}."
        )
        description = serializers.CharField(required=False, allow_blank=True, max_length=5000, default="")

    class FileInputSerializer(InputSerializer):
        file = serializers.FileField(help_text="Any file: a SQLite database, JSON, parquet …")

    @property
    def max_upload_bytes(self) -> int:
        return selectors.attachment_max_bytes()

    @extend_schema(
        operation_id="attachments_create",
        request={"multipart/form-data": FileInputSerializer},
        responses={201: AttachmentOutput, 200: AttachmentOutput, 400: ErrorSerializer, 413: ErrorSerializer},
        description="201 with a new attachment; 200 with the one already there when the same file was uploaded "
        "under the same name before.",
    )
    def post(self, request):
        data = body(self.InputSerializer, request)
        file = request.FILES.get("file") if hasattr(request, "FILES") else None
        if file is None:
            raise ApplicationError("Send the file as the multipart field 'file'.", field_errors={"file": ["required"]})
        attachment, created = attachments.attachment_create(
            owner=request.user,
            source=file,
            name=data["name"] or file.name,
            size=file.size,
            description=data["description"],
        )
        return Response(AttachmentOutput(attachment).data, status=201 if created else 200)


class AttachmentDetailApi(Api):
    @extend_schema(operation_id="attachments_retrieve", responses={200: AttachmentOutput, 404: ErrorSerializer})
    def get(self, request, attachment_id: int):
        attachment = selectors.attachment_get(user=request.user, attachment_id=attachment_id)
        return Response(AttachmentOutput(attachment).data)


class AttachmentDeleteApi(WriteApi):
    @extend_schema(
        operation_id="attachments_delete",
        request=None,
        responses={204: None, 400: ErrorSerializer, 404: ErrorSerializer},
    )
    def post(self, request, attachment_id: int):
        attachment = selectors.attachment_get(user=request.user, attachment_id=attachment_id)
        attachments.attachment_delete(attachment=attachment, actor=request.user)
        return Response(status=204)
