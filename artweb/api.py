"""Plumbing shared by every API view: body parsing with a size limit, write throttling, keyset
pagination, query-parameter parsing, uploads, and streamed responses.

It lives in artweb so that both apps' APIs use it: training imports rollouts, never the other way round,
and neither app owns what they share.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db.models import BooleanField, QuerySet
from django.db.models.expressions import RawSQL
from django.http import StreamingHttpResponse
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.parsers import BaseParser, MultiPartParser
from rest_framework.settings import api_settings
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from artweb.api_errors import PayloadTooLarge, exception_handler
from artweb.errors import ApplicationError
from artweb.jsonlimits import JSONLimitError, json_loads_limited
from rollouts.sandbox.jsonsafe import loads_bounded

KIB = 1024
MIB = 1024 * KIB
# PostgreSQL's integer and bigint bounds: a step or version number fits MAX_INT, a row id MAX_ID. Inputs
# are bounded by them so an out-of-range number is a 400 that says so, not a database error.
MAX_INT = 2**31 - 1
MAX_ID = 2**63 - 1

# Rates used when settings give none for a scope (REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] wins).
DEFAULT_THROTTLE_RATES = {
    "writes": "120/min",
    "uploads": "30/min",
    "runs": "30/min",
    "tokens": "10/min",
    "endpoint": "600/min",
}


# --- parsing ---------------------------------------------------------------------------------------


def reject_nul(data, path: str = "") -> None:
    """PostgreSQL stores neither NUL in text nor \\u0000 in jsonb: refuse it at the door with a 400."""
    if isinstance(data, str):
        if "\x00" in data:
            raise exceptions.ValidationError({path or "body": ["must not contain NUL (\\u0000) characters"]})
    elif isinstance(data, dict):
        for key, value in data.items():
            reject_nul(key, path or "body")
            reject_nul(value, f"{path}.{key}" if path else str(key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            reject_nul(value, f"{path}.{i}" if path else str(i))


class LimitedJSONParser(BaseParser):
    """Strict JSON (no NaN/Infinity), UTF-8, at most ``view.max_json_bytes`` bytes and
    settings.ARTWEB_MAX_JSON_DEPTH levels deep.

    DRF's own JSONParser reads any size into memory and recurses as deep as the body nests; this one stops
    at the view's size limit with a 413 and refuses a deeper body with a 400 naming the depth limit.
    """

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):
        view = (parser_context or {}).get("view")
        limit = getattr(view, "max_json_bytes", MIB)
        raw = stream.read(limit + 1)
        if len(raw) > limit:
            raise PayloadTooLarge(
                f"The JSON body is larger than {limit} bytes. Upload large content as a multipart file instead."
            )
        try:
            data = json_loads_limited(raw)
        except UnicodeDecodeError as exc:
            raise exceptions.ParseError(f"JSON body is not UTF-8 (byte {exc.start} is invalid)") from exc
        except JSONLimitError as exc:
            raise exceptions.ParseError(str(exc)) from exc
        except ValueError as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from exc
        reject_nul(data)
        return data


class LimitedMultiPartParser(MultiPartParser):
    """Multipart forms whose declared length is within the view's upload limit (files spill to disk)."""

    def parse(self, stream, media_type=None, parser_context=None):
        request = parser_context["request"]
        view = parser_context.get("view")
        limit = getattr(view, "max_upload_bytes", MIB) + 64 * KIB  # room for the form's other fields
        length = int(request.META.get("CONTENT_LENGTH") or 0)
        if length > limit:
            raise PayloadTooLarge(f"The upload is {length} bytes; the limit is {limit} bytes.")
        result = super().parse(stream, media_type, parser_context)
        reject_nul(result.data.dict())
        return result


# --- throttling ------------------------------------------------------------------------------------


class WriteThrottle(ScopedRateThrottle):
    """ScopedRateThrottle whose rates are read at request time (so settings overrides apply) and whose
    cache key names the database, so deployments or test sessions sharing one Redis do not collide."""

    @property
    def THROTTLE_RATES(self):
        return {**DEFAULT_THROTTLE_RATES, **(api_settings.DEFAULT_THROTTLE_RATES or {})}

    def get_cache_key(self, request, view):
        key = super().get_cache_key(request, view)
        return f"{key}_{settings.DATABASES['default']['NAME']}" if key else key


# --- base views ------------------------------------------------------------------------------------


class ApiSchema(AutoSchema):
    """Names nested serializers after their view: RunCreateApi.InputSerializer → "RunCreateInput"
    (every view's serializers are called InputSerializer/OutputSerializer, which would collide)."""

    def get_serializer_name(self, serializer, direction):
        parts = serializer.__class__.__qualname__.split(".")
        if len(parts) > 1:
            return parts[0].removesuffix("Api") + "".join(p.removesuffix("Serializer") for p in parts[1:])
        return super().get_serializer_name(serializer, direction)


class Api(APIView):
    """Reads: JSON bodies only, 1 MiB at most. Errors in the one shape of artweb.api_errors."""

    parser_classes = [LimitedJSONParser]
    max_json_bytes = MIB
    schema = ApiSchema()

    def get_exception_handler(self):
        # Set here as well as in settings, so these views answer in the one error shape whatever the
        # project-wide REST_FRAMEWORK["EXCEPTION_HANDLER"] says.
        return exception_handler


class WriteApi(Api):
    """Writes are throttled per user, by scope (see DEFAULT_THROTTLE_RATES)."""

    throttle_classes = [WriteThrottle]
    throttle_scope = "writes"


class UploadApi(WriteApi):
    """Uploads take a JSON body with the text, or a multipart form with a file."""

    parser_classes = [LimitedJSONParser, LimitedMultiPartParser]
    throttle_scope = "uploads"
    max_upload_bytes = MIB
    # JSON escaping can make the text of a valid upload several times larger on the wire.
    max_json_bytes = 4 * MIB


class LimitOffset(LimitOffsetPagination):
    default_limit = 50
    max_limit = 500
    max_offset = 10**9

    def get_offset(self, request):
        return min(super().get_offset(request), self.max_offset)


def paginated_response(*, request, view, queryset, serializer_class):
    paginator = LimitOffset()
    page = paginator.paginate_queryset(queryset, request, view=view)
    return paginator.get_paginated_response(serializer_class(page, many=True, context={"request": request}).data)


def paginated_schema(serializer_class, name: str):
    """The schema of a limit/offset page of serializer_class, for @extend_schema(responses=...)."""
    return inline_serializer(
        name=name,
        fields={
            "count": serializers.IntegerField(),
            "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True),
            "results": serializer_class(many=True),
        },
    )


PAGE_PARAMETERS = [
    OpenApiParameter("limit", int, description="Page size (default 50, at most 500)."),
    OpenApiParameter("offset", int, description="Rows to skip."),
]


def query_params(serializer_class: type[serializers.Serializer], request) -> dict:
    """Validate query parameters with a serializer (400 in the usual error shape on bad input)."""
    params = dict(request.query_params.items())
    reject_nul(params)
    serializer = serializer_class(data=params)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def body(serializer_class: type[serializers.Serializer], request) -> dict:
    if not isinstance(request.data, dict):
        raise exceptions.ValidationError({"non_field_errors": ["The body must be a JSON object."]})
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


class FiniteFloatField(serializers.FloatField):
    """A float that must be finite (no NaN or infinities from query strings)."""

    def to_internal_value(self, data):
        import math

        value = super().to_internal_value(data)
        if not math.isfinite(value):
            self.fail("invalid")
        return value


# --- uploads ---------------------------------------------------------------------------------------


def upload_bytes(*, file, content: str | None, max_bytes: int, what: str, field: str = "file") -> bytes:
    """The bytes of an upload given as a file or as text; 413 over max_bytes, 400 for binary data."""
    if file is not None:
        if file.size > max_bytes:
            raise PayloadTooLarge(f"The {what} is {file.size} bytes; the limit is {max_bytes} bytes.")
        raw = file.read()
    elif content is not None:
        raw = content.encode("utf-8")
        field = "content"
        if len(raw) > max_bytes:
            raise PayloadTooLarge(f"The {what} is {len(raw)} bytes; the limit is {max_bytes} bytes.")
    else:
        raise ApplicationError(
            f"Send the {what} as a 'file' (multipart form) or as 'content' (JSON).",
            field_errors={"file": ["required (or content)"]},
        )
    if b"\x00" in raw:
        raise ApplicationError(
            f"The {what} contains NUL bytes; it looks like a binary file. Upload UTF-8 text.",
            field_errors={field: ["binary data"]},
        )
    return raw


def decode_utf8(raw: bytes, *, what: str, field: str = "file") -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApplicationError(
            f"The {what} is not UTF-8 text (byte {exc.start} is invalid). Save it as UTF-8 and upload it again.",
            field_errors={field: ["not UTF-8"]},
        ) from exc


# --- keyset pagination ---------------------------------------------------------------------------

MAX_KEY = MAX_ID


def cursor_encode(values) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(values), separators=(",", ":")).encode()).decode().rstrip("=")


def cursor_decode(cursor: str, n: int) -> list[int]:
    try:
        values = loads_bounded(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)), max_depth=1)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        values = None
    if (
        not isinstance(values, list)
        or len(values) != n
        or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_KEY for v in values)
    ):
        raise exceptions.ValidationError({"cursor": ["invalid: pass next_cursor from the previous page unchanged"]})
    return values


def keyset_page(
    qs: QuerySet, *, keys: tuple[str, ...], columns: tuple[str, ...], cursor: str | None, limit: int
) -> tuple[list, str | None]:
    """One page of qs ordered by keys (ascending, non-null integers, unique together), after cursor.

    A row comparison ``(a, b, c) > (x, y, z)`` lets PostgreSQL start the index scan at the cursor, so
    page 2,000 costs what page 1 costs (OFFSET would read and throw away every row before it).
    """
    table = qs.model._meta.db_table
    qs = qs.order_by(*keys)
    if cursor:
        values = cursor_decode(cursor, len(keys))
        cols = ", ".join(f'"{table}"."{c}"' for c in columns)
        marks = ", ".join(["%s"] * len(values))
        qs = qs.filter(RawSQL(f"({cols}) > ({marks})", values, output_field=BooleanField()))
    rows = list(qs[: limit + 1])
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    last = rows[-1]
    return rows, cursor_encode(getattr(last, k) for k in keys)


# --- streaming -------------------------------------------------------------------------------------


def _is_asgi(request) -> bool:
    from django.core.handlers.asgi import ASGIRequest

    return isinstance(getattr(request, "_request", request), ASGIRequest)


async def _async_chunks(chunks: Iterator[bytes]):
    # Each chunk is produced (database reads included) on Django's one sync thread, a chunk at a time,
    # so memory stays bounded; Django would otherwise turn a sync iterator into one big list under ASGI.
    sentinel = object()
    while True:
        chunk = await sync_to_async(next, thread_sensitive=True)(chunks, sentinel)
        if chunk is sentinel:
            return
        yield chunk


def stream_response(
    request, chunks: Iterator[bytes], *, content_type: str, filename: str, length: int | None = None
) -> StreamingHttpResponse:
    response = StreamingHttpResponse(_async_chunks(chunks) if _is_asgi(request) else chunks, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    if length is not None:
        response["Content-Length"] = str(length)
    return response
