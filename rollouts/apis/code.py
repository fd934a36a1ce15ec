"""Rollout scripts and reward functions: upload (JSON text or a multipart file), versions, validation.

The two kinds of code asset have the same operations; each operation is written once here on a
base class and bound to scripts or rewards by a few class attributes in the concrete classes below.
"""

from __future__ import annotations

from django.db.models import Count, Max
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from artweb.api import (
    MAX_INT,
    PAGE_PARAMETERS,
    Api,
    UploadApi,
    WriteApi,
    body,
    decode_utf8,
    paginated_response,
    paginated_schema,
    query_params,
    upload_bytes,
)
from artweb.api_errors import ErrorSerializer, PayloadTooLarge
from rollouts import selectors, services
from rollouts.models import RewardFunction
from rollouts.sandbox.bundles import BundleError, bundle_read
from rollouts.sandbox.validation import MAX_SOURCE_BYTES, validate_reward, validate_script
from rollouts.selectors import bundle_upload_bytes

# One limit for code, the sandbox's: larger uploads get a 413 here instead of a validation issue.
MAX_CODE_BYTES = MAX_SOURCE_BYTES
ZIP_MAGIC = b"PK\x03\x04"  # a zip archive's first local file header
ERRORS = {400: ErrorSerializer, 404: ErrorSerializer, 413: ErrorSerializer}


class CodeJsonInput(serializers.Serializer):
    content = serializers.CharField(
        trim_whitespace=False,
        max_length=MAX_CODE_BYTES,
        help_text=f"The Python source, UTF-8, at most {MAX_CODE_BYTES // 1024} KiB.",
    )


class CodeFileInput(serializers.Serializer):
    file = serializers.FileField(help_text=f"A UTF-8 .py file, at most {MAX_CODE_BYTES // 1024} KiB.")


class ScriptFileInput(serializers.Serializer):
    file = serializers.FileField(
        help_text=f"A UTF-8 .py file (at most {MAX_CODE_BYTES // 1024} KiB), or a bundle: a .zip with rollout.py "
        "at its root beside helper modules, data files and pure-Python wheels."
    )


def _code_bytes(request, what: str) -> bytes:
    """The uploaded source from either a multipart 'file' or a JSON 'content'."""
    data = request.data
    file = request.FILES.get("file") if hasattr(request, "FILES") else None
    content = data.get("content") if hasattr(data, "get") else None
    if content is not None and not isinstance(content, str):
        raise serializers.ValidationError({"content": ["must be a string"]})
    return upload_bytes(file=file, content=content, max_bytes=MAX_CODE_BYTES, what=what)


def _script_upload(request) -> dict:
    """services.script_create's code arguments: `bundle` for a zip file (by its name or its first bytes),
    else `content`, the source."""
    file = request.FILES.get("file") if hasattr(request, "FILES") else None
    if file is not None and (file.name.lower().endswith(".zip") or file.read(4) == ZIP_MAGIC):
        limit = bundle_upload_bytes()
        if file.size > limit:
            raise PayloadTooLarge(f"The bundle is {file.size} bytes; the limit is {limit} bytes.")
        file.seek(0)
        return {"bundle": file.read()}
    if file is not None:
        file.seek(0)
    return {"content": _code_bytes(request, "rollout script")}


# --- shared outputs --------------------------------------------------------------------------------


class AssetOutput(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    description = serializers.CharField()
    latest_version = serializers.IntegerField(source="latest_version_number", allow_null=True)
    version_count = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class ScriptOutput(AssetOutput):
    companion_reward = serializers.IntegerField(
        source="companion_reward_id",
        allow_null=True,
        help_text="Id of the reward function written for this script; the launch form preselects its newest version.",
    )


class VersionOutput(serializers.Serializer):
    id = serializers.IntegerField()
    asset_id = serializers.IntegerField()
    name = serializers.CharField(source="asset.name")
    number = serializers.IntegerField()
    sha256 = serializers.CharField()
    note = serializers.CharField()
    created_at = serializers.DateTimeField()


class RewardVersionOutput(VersionOutput):
    kind = serializers.ChoiceField(choices=RewardFunction.Kind.choices)


class ScriptVersionDetailOutput(VersionOutput):
    content = serializers.CharField(help_text="The script's source; for a bundle, its rollout.py.")
    bundle_sha256 = serializers.CharField(help_text="The bundle's hash when the version is a bundle; else empty.")


class RewardVersionDetailOutput(RewardVersionOutput):
    content = serializers.CharField()


class ValidationIssue(serializers.Serializer):
    line = serializers.IntegerField(allow_null=True)
    message = serializers.CharField()


def _annotated(qs):
    return qs.annotate(latest_version_number=Max("versions__number"), version_count=Count("versions"))


# --- operations, written once ----------------------------------------------------------------------


class _AssetListApi(Api):
    what = ""

    class FilterSerializer(serializers.Serializer):
        name = serializers.CharField(required=False, max_length=200, help_text="Exact name.")

    output = AssetOutput

    def list(self, request, qs):
        filters = query_params(self.FilterSerializer, request)
        if filters.get("name"):
            qs = qs.filter(name=filters["name"])
        return paginated_response(
            request=request,
            view=self,
            queryset=_annotated(qs).order_by("-updated_at", "-id"),
            serializer_class=self.output,
        )


class _AssetDetailApi(Api):
    output = AssetOutput

    def detail(self, asset):
        asset = _annotated(type(asset).objects.filter(id=asset.id)).get()
        return Response(self.output(asset).data)


class _VersionListApi(Api):
    output = VersionOutput

    def list(self, request, asset):
        return paginated_response(
            request=request,
            view=self,
            queryset=asset.versions.select_related("asset").order_by("-number"),
            serializer_class=self.output,
        )


# --- rollout scripts -------------------------------------------------------------------------------


class ScriptListApi(_AssetListApi):
    output = ScriptOutput

    @extend_schema(
        operation_id="scripts_list",
        parameters=[_AssetListApi.FilterSerializer, *PAGE_PARAMETERS],
        responses={200: paginated_schema(ScriptOutput, "PaginatedScriptList")},
    )
    def get(self, request):
        return self.list(request, selectors.script_list(user=request.user))


class ScriptCreateApi(UploadApi):
    @property
    def max_upload_bytes(self) -> int:
        return bundle_upload_bytes()

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=200)
        description = serializers.CharField(required=False, allow_blank=True, max_length=5000, default="")
        companion_reward = serializers.IntegerField(
            required=False,
            allow_null=True,
            default=None,
            help_text="Id of one of your reward functions written for this script (the launch form preselects it).",
        )

    class JsonInputSerializer(InputSerializer, CodeJsonInput):
        pass

    class FileInputSerializer(InputSerializer, ScriptFileInput):
        pass

    @extend_schema(
        operation_id="scripts_create",
        request={"application/json": JsonInputSerializer, "multipart/form-data": FileInputSerializer},
        responses={201: VersionOutput, **ERRORS},
    )
    def post(self, request):
        data = body(self.InputSerializer, request)
        code = _script_upload(request)
        companion = (
            selectors.reward_get(user=request.user, reward_id=data["companion_reward"])
            if data["companion_reward"] is not None
            else None
        )
        version = services.script_create(
            owner=request.user,
            name=data["name"],
            description=data["description"],
            companion_reward=companion,
            **code,
        )
        return Response(VersionOutput(version).data, status=201)


class ScriptValidateApi(UploadApi):
    throttle_scope = "writes"

    class OutputSerializer(serializers.Serializer):
        valid = serializers.BooleanField()
        issues = ValidationIssue(many=True)

    @property
    def max_upload_bytes(self) -> int:
        return bundle_upload_bytes()

    @extend_schema(
        operation_id="scripts_validate",
        request={"application/json": CodeJsonInput, "multipart/form-data": ScriptFileInput},
        responses={200: OutputSerializer, **ERRORS},
    )
    def post(self, request):
        code = _script_upload(request)
        if "bundle" in code:
            issues = _bundle_issues(code["bundle"])
        else:
            issues = validate_script(decode_utf8(code["content"], what="rollout script"))
        return Response(self.OutputSerializer({"valid": not issues, "issues": _issues(issues)}).data)


def _bundle_issues(data: bytes) -> list[dict]:
    """A bundle's refusal, or its rollout.py's issues as a script's, each message saying where."""
    try:
        bundle = bundle_read(data, selectors.bundle_limits())
        text = bundle.rollout_bytes.decode("utf-8")
    except BundleError as exc:
        return [{"line": None, "message": str(exc)}]
    except UnicodeDecodeError as exc:
        return [{"line": None, "message": f"rollout.py is not UTF-8 text (byte {exc.start}); save it as UTF-8."}]
    return [{**issue, "message": f"rollout.py: {issue['message']}"} for issue in validate_script(text)]


class ScriptDetailApi(_AssetDetailApi):
    output = ScriptOutput

    @extend_schema(operation_id="scripts_retrieve", responses={200: ScriptOutput, 404: ErrorSerializer})
    def get(self, request, script_id: int):
        return self.detail(selectors.script_get(user=request.user, script_id=script_id))


class ScriptCompanionApi(WriteApi):
    """Set (or clear, with null) the reward function written for a script."""

    class InputSerializer(serializers.Serializer):
        companion_reward = serializers.IntegerField(
            allow_null=True, help_text="Id of one of your reward functions, or null."
        )

    @extend_schema(
        operation_id="scripts_companion_set",
        request=InputSerializer,
        responses={200: ScriptOutput, 400: ErrorSerializer, 404: ErrorSerializer},
    )
    def put(self, request, script_id: int):
        script = selectors.script_get(user=request.user, script_id=script_id)
        data = body(self.InputSerializer, request)
        reward = (
            selectors.reward_get(user=request.user, reward_id=data["companion_reward"])
            if data["companion_reward"] is not None
            else None
        )
        services.script_companion_set(script=script, reward=reward)
        return ScriptDetailApi().detail(script)


class ScriptVersionListApi(_VersionListApi):
    @extend_schema(
        operation_id="scripts_versions_list",
        parameters=PAGE_PARAMETERS,
        responses={200: paginated_schema(VersionOutput, "PaginatedScriptVersionList"), 404: ErrorSerializer},
    )
    def get(self, request, script_id: int):
        return self.list(request, selectors.script_get(user=request.user, script_id=script_id))


class _VersionCreateApi(UploadApi):
    """A new version of a script or reward: its code as JSON or a file upload, and a note."""

    max_upload_bytes = MAX_CODE_BYTES

    class InputSerializer(serializers.Serializer):
        note = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")

    class JsonInputSerializer(InputSerializer, CodeJsonInput):
        pass

    class FileInputSerializer(InputSerializer, CodeFileInput):
        pass

    REQUEST = {"application/json": JsonInputSerializer, "multipart/form-data": FileInputSerializer}


class ScriptVersionCreateApi(_VersionCreateApi):
    class FileInputSerializer(_VersionCreateApi.InputSerializer, ScriptFileInput):
        pass

    @property
    def max_upload_bytes(self) -> int:
        return bundle_upload_bytes()

    @extend_schema(
        operation_id="scripts_versions_create",
        request={"application/json": _VersionCreateApi.JsonInputSerializer, "multipart/form-data": FileInputSerializer},
        responses={201: VersionOutput, **ERRORS},
    )
    def post(self, request, script_id: int):
        script = selectors.script_get(user=request.user, script_id=script_id)
        data = body(self.InputSerializer, request)
        version = services.script_version_create(script=script, note=data["note"], **_script_upload(request))
        return Response(VersionOutput(version).data, status=201)


class ScriptVersionDetailApi(Api):
    @extend_schema(
        operation_id="scripts_versions_retrieve", responses={200: ScriptVersionDetailOutput, 404: ErrorSerializer}
    )
    def get(self, request, script_id: int, number: int):
        script = selectors.script_get(user=request.user, script_id=script_id)
        version = _version(script, number)
        return Response(ScriptVersionDetailOutput(version).data)


# --- reward functions ------------------------------------------------------------------------------


class RewardListApi(_AssetListApi):
    @extend_schema(
        operation_id="rewards_list",
        parameters=[_AssetListApi.FilterSerializer, *PAGE_PARAMETERS],
        responses={200: paginated_schema(AssetOutput, "PaginatedRewardList")},
    )
    def get(self, request):
        return self.list(request, selectors.reward_list(user=request.user))


class RewardCreateApi(UploadApi):
    max_upload_bytes = MAX_CODE_BYTES

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=200)
        description = serializers.CharField(required=False, allow_blank=True, max_length=5000, default="")

    class JsonInputSerializer(InputSerializer, CodeJsonInput):
        pass

    class FileInputSerializer(InputSerializer, CodeFileInput):
        pass

    @extend_schema(
        operation_id="rewards_create",
        request={"application/json": JsonInputSerializer, "multipart/form-data": FileInputSerializer},
        responses={201: RewardVersionOutput, **ERRORS},
    )
    def post(self, request):
        data = body(self.InputSerializer, request)
        raw = _code_bytes(request, "reward function")
        version = services.reward_create(
            owner=request.user, name=data["name"], content=raw, description=data["description"]
        )
        return Response(RewardVersionOutput(version).data, status=201)


class RewardValidateApi(UploadApi):
    max_upload_bytes = MAX_CODE_BYTES
    throttle_scope = "writes"

    class OutputSerializer(serializers.Serializer):
        valid = serializers.BooleanField()
        kind = serializers.CharField(allow_null=True, help_text="trajectory or group, when recognised.")
        issues = ValidationIssue(many=True)

    @extend_schema(
        operation_id="rewards_validate",
        request={"application/json": CodeJsonInput, "multipart/form-data": CodeFileInput},
        responses={200: OutputSerializer, **ERRORS},
    )
    def post(self, request):
        text = decode_utf8(_code_bytes(request, "reward function"), what="reward function")
        kind, issues = validate_reward(text)
        return Response(
            self.OutputSerializer({"valid": not issues, "kind": kind or None, "issues": _issues(issues)}).data
        )


class RewardDetailApi(_AssetDetailApi):
    @extend_schema(operation_id="rewards_retrieve", responses={200: AssetOutput, 404: ErrorSerializer})
    def get(self, request, reward_id: int):
        return self.detail(selectors.reward_get(user=request.user, reward_id=reward_id))


class RewardVersionListApi(_VersionListApi):
    output = RewardVersionOutput

    @extend_schema(
        operation_id="rewards_versions_list",
        parameters=PAGE_PARAMETERS,
        responses={200: paginated_schema(RewardVersionOutput, "PaginatedRewardVersionList"), 404: ErrorSerializer},
    )
    def get(self, request, reward_id: int):
        return self.list(request, selectors.reward_get(user=request.user, reward_id=reward_id))


class RewardVersionCreateApi(_VersionCreateApi):
    @extend_schema(
        operation_id="rewards_versions_create",
        request=_VersionCreateApi.REQUEST,
        responses={201: RewardVersionOutput, **ERRORS},
    )
    def post(self, request, reward_id: int):
        reward = selectors.reward_get(user=request.user, reward_id=reward_id)
        data = body(self.InputSerializer, request)
        raw = _code_bytes(request, "reward function")
        version = services.reward_version_create(reward=reward, content=raw, note=data["note"])
        return Response(RewardVersionOutput(version).data, status=201)


class RewardVersionDetailApi(Api):
    @extend_schema(
        operation_id="rewards_versions_retrieve", responses={200: RewardVersionDetailOutput, 404: ErrorSerializer}
    )
    def get(self, request, reward_id: int, number: int):
        reward = selectors.reward_get(user=request.user, reward_id=reward_id)
        return Response(RewardVersionDetailOutput(_version(reward, number)).data)


# --- helpers ---------------------------------------------------------------------------------------


def _version(asset, number: int):
    version = asset.versions.select_related("asset").filter(number=number).first() if number <= MAX_INT else None
    if version is None:
        raise Http404
    return version


def _issues(issues) -> list[dict]:
    return [{"line": i.get("line"), "message": str(i.get("message", ""))} for i in issues or []]
