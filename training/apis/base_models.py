"""Base models: the shared ones and the user's own; register by Hugging Face id (local paths: staff)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from artweb.api import PAGE_PARAMETERS, Api, WriteApi, body, paginated_response, paginated_schema
from artweb.api_errors import ErrorSerializer
from training import selectors, services
from training.services.model_files import source_shown


class BaseModelOutput(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    source = serializers.SerializerMethodField(
        help_text="Hugging Face id, or for a directory on the server its path (staff) or 'a directory on the server'."
    )
    revision = serializers.CharField()
    max_length = serializers.IntegerField()
    supports_tools = serializers.BooleanField()
    recommended_train = serializers.DictField(
        help_text="Training settings that suit this model; a run's train settings left out take these values."
    )
    shared = serializers.SerializerMethodField(help_text="True for models everyone may use.")
    created_at = serializers.DateTimeField()

    def get_source(self, obj) -> str:
        request = self.context.get("request")
        return source_shown(obj.source, getattr(request, "user", None))

    def get_shared(self, obj) -> bool:
        return obj.owner_id is None


class BaseModelListApi(Api):
    @extend_schema(
        operation_id="base_models_list",
        parameters=PAGE_PARAMETERS,
        responses={200: paginated_schema(BaseModelOutput, "PaginatedBaseModelList")},
    )
    def get(self, request):
        qs = selectors.base_model_visible(request.user).order_by("name", "id")
        return paginated_response(request=request, view=self, queryset=qs, serializer_class=BaseModelOutput)


class BaseModelRegisterApi(WriteApi):
    """Register a model by Hugging Face id (org/name). Registering the same name and source again
    returns the existing model."""

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=200)
        source = serializers.CharField(max_length=500, help_text="Hugging Face id, or a server directory (staff).")
        revision = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
        max_length = serializers.IntegerField(min_value=16, max_value=1_048_576, required=False, default=2048)
        chat_template_override = serializers.CharField(
            required=False, allow_blank=True, default="", max_length=100_000, trim_whitespace=False
        )
        supports_tools = serializers.BooleanField(required=False, default=False)
        recommended_train = serializers.DictField(
            required=False, default=dict, help_text='TrainConfig keys, e.g. {"learning_rate": 0.0002}.'
        )

    @extend_schema(
        operation_id="base_models_register",
        request=InputSerializer,
        responses={201: BaseModelOutput, 400: ErrorSerializer},
    )
    def post(self, request):
        data = body(self.InputSerializer, request)
        model = services.base_model_register(owner=request.user, **data)
        return Response(BaseModelOutput(model, context={"request": request}).data, status=201)
