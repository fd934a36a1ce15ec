"""The API's one error shape: ``{"message": "...", "field_errors": {"field": ["...", ...]}}``.

DRF's exception handler is pointed here (REST_FRAMEWORK["EXCEPTION_HANDLER"]). Whatever went wrong
(an ApplicationError from a service, a serializer's validation errors, a body that is not JSON, a
missing token, a throttle, a 404) the client reads one ``message`` that says what to fix, and
``field_errors`` keyed by dotted field path where the problem is with particular fields.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from artweb.errors import ApplicationError


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


class SignInLockedOut(exceptions.APIException):
    """Too many failed sign-ins for this username from this address (django-axes); see artweb.auth."""

    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_detail = "Too many failed sign-ins; try again later."
    default_code = "locked_out"

    def __init__(self, detail=None, *, wait: int | None = None):
        super().__init__(detail)
        self.wait = wait  # seconds; DRF sends it as Retry-After


class ErrorSerializer(serializers.Serializer):
    """The body of every 4xx answer (used in the OpenAPI schema)."""

    message = serializers.CharField()
    field_errors = serializers.DictField(child=serializers.ListField(child=serializers.CharField()))


def exception_handler(exc, context):
    if isinstance(exc, ApplicationError):
        set_rollback()
        return Response(exc.as_dict(), status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(serializers.as_serializer_error(exc))
    elif isinstance(exc, (RequestDataTooBig, TooManyFieldsSent)):
        exc = PayloadTooLarge(f"The request is too large: {exc}. Upload big content as a file.")

    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # not an API error: Django answers 500 and logs it
    response.data = error_body(exc, response.data)
    return response


def error_body(exc, data) -> dict:
    if isinstance(exc, exceptions.ValidationError):
        field_errors = flatten_errors(data)
        general = field_errors.pop("non_field_errors", []) + field_errors.pop("", [])
        if general and not field_errors:
            message = " ".join(general)
        else:
            parts = [f"{field}: {msgs[0]}" for field, msgs in field_errors.items()]
            message = "Invalid input. " + "; ".join(general + parts)
        return {"message": message, "field_errors": field_errors}
    if isinstance(exc, exceptions.ParseError):
        return {
            "message": f"The request body could not be read ({_text(data)}). Send a JSON object with "
            "'Content-Type: application/json', or a multipart form for file uploads.",
            "field_errors": {},
        }
    if isinstance(exc, exceptions.UnsupportedMediaType):
        return {
            "message": f"{_text(data)} Send JSON ('Content-Type: application/json'); uploads also take "
            "'multipart/form-data' with a 'file' field.",
            "field_errors": {},
        }
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        return {
            "message": f"{_text(data)} Send 'Authorization: Token <key>' (create a key with "
            "POST /api/v1/tokens/ or on the API tokens page).",
            "field_errors": {},
        }
    if isinstance(exc, exceptions.Throttled):
        wait = f" Try again in {int(exc.wait) + 1} seconds." if exc.wait is not None else ""
        return {"message": f"Too many requests of this kind.{wait}", "field_errors": {}}
    if isinstance(exc, exceptions.NotFound):
        return {"message": "Not found: it does not exist, or it is not yours.", "field_errors": {}}
    return {"message": _text(data), "field_errors": {}}


def _text(data) -> str:
    if isinstance(data, dict) and "detail" in data:
        return str(data["detail"])
    return str(data)


def flatten_errors(data, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error structure → {"a.b.0.c": ["message", ...]}."""
    out: dict[str, list[str]] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            key = str(key)
            path = key if not prefix else (prefix if key == "non_field_errors" else f"{prefix}.{key}")
            for k, v in flatten_errors(value, path).items():
                out.setdefault(k, []).extend(v)
    elif isinstance(data, list):
        if all(not isinstance(item, (dict, list)) for item in data):
            if data:
                out.setdefault(prefix, []).extend(str(item) for item in data)
        else:
            for i, item in enumerate(data):
                for k, v in flatten_errors(item, f"{prefix}.{i}" if prefix else str(i)).items():
                    out.setdefault(k, []).extend(v)
    elif data is not None:
        out.setdefault(prefix, []).append(str(data))
    return out
