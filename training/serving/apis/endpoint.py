"""The OpenAI-compatible endpoint (`/api/v1/openai/`).

It speaks OpenAI's protocol, not the rest of the API's: `Authorization: Bearer <token>` (the API token;
`Token <token>` works too), errors as {"error": {"message", "type", "param", "code"}}, and server-sent
events when `stream` is true. So the official `openai` client works unchanged with
`base_url=<server>/api/v1/openai`. They are plain async Django views (no DRF): a streamed answer is
relayed chunk by chunk from the worker's reply list (training.serving.protocol) without a thread per
request.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from asgiref.sync import sync_to_async
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework.authtoken.models import Token

from artweb.api import WriteThrottle
from artweb.jsonlimits import JSONLimitError, json_loads_limited
from training.serving.protocol import ServeError, ServeTarget
from training.serving.selectors import serve_model_list, serve_model_resolve
from training.serving.services.serving import serve_body_check, serve_exchange_start


def _error(exc: ServeError) -> JsonResponse:
    response = JsonResponse(exc.as_dict(), status=exc.status)
    if exc.retry_after is not None:
        response["Retry-After"] = str(exc.retry_after)
    return response


# DRF's scoped throttle, asked outside a DRF view: its scope comes from this stand-in for the view.
_ENDPOINT_SCOPE = SimpleNamespace(throttle_scope="endpoint")


def endpoint_throttle(request, user) -> None:
    """Count a chat completion against the user's endpoint rate (ARTWEB_THROTTLE_ENDPOINT); over it, a 429
    in OpenAI's shape with Retry-After, which the openai client waits out and retries by itself."""
    request.user = user  # what the throttle keys on
    throttle = WriteThrottle()
    if throttle.allow_request(request, _ENDPOINT_SCOPE):
        return
    wait = max(1, math.ceil(throttle.wait() or 1))
    raise ServeError(
        429,
        f"Too many chat completions: your limit on this endpoint is {throttle.rate}. Try again in {wait} s, "
        "or ask an operator to raise ARTWEB_THROTTLE_ENDPOINT.",
        code="rate_limit_exceeded",
        retry_after=wait,
    )


def bearer_user(request):
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() not in ("bearer", "token") or not key.strip():
        raise ServeError(
            401,
            "Send your API token as 'Authorization: Bearer <token>' (create one with POST /api/v1/tokens/).",
            code="invalid_api_key",
        )
    token = Token.objects.select_related("user").filter(key=key.strip()).first()
    if token is None or not token.user.is_active:
        raise ServeError(401, "That API token is not valid; create a new one.", code="invalid_api_key")
    return token.user


def _prepare(request, raw: bytes) -> tuple[ServeTarget, dict]:
    user = bearer_user(request)
    endpoint_throttle(request, user)
    try:
        body = json_loads_limited(raw or b"null")
    except JSONLimitError as exc:
        raise ServeError(400, str(exc)) from None
    except ValueError:
        raise ServeError(400, "The request body is not JSON.") from None
    body = serve_body_check(body)
    target = serve_model_resolve(user=user, name=body.get("model"))
    return target, body


_prepare_async = sync_to_async(_prepare, thread_sensitive=False)
_user_async = sync_to_async(bearer_user, thread_sensitive=False)


async def relay_chat(request, prepare) -> HttpResponse:
    """Answer a chat completion request: `prepare(request, raw body)` (awaitable) checks it and says which
    model it means; the answer is relayed whole, or chunk by chunk when `stream` is true."""
    if request.method != "POST":
        return _error(ServeError(405, "Use POST for chat completions."))
    try:
        target, body = await prepare(request, request.body)
        exchange = await serve_exchange_start(target=target, body=body)
        if not body.get("stream"):
            return HttpResponse(await exchange.answer(), content_type="application/json")
    except ServeError as exc:
        return _error(exc)
    response = StreamingHttpResponse(exchange.events(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


@csrf_exempt
async def chat_completions(request):
    return await relay_chat(request, _prepare_async)


async def models_list(request):
    try:
        user = await _user_async(request)
    except ServeError as exc:
        return _error(exc)
    data = await sync_to_async(serve_model_list, thread_sensitive=False)(user=user)
    return JsonResponse({"object": "list", "data": data})
