"""The OpenAI-compatible endpoint (`/api/v1/openai/`), and checkpoint aliases.

The endpoint speaks OpenAI's protocol, not the rest of the API's: `Authorization: Bearer <token>` (the
API token; `Token <token>` works too), errors as {"error": {"message", "type", "param", "code"}}, and
server-sent events when `stream` is true. So the official `openai` client works unchanged with
`base_url=<server>/api/v1/openai`. They are plain async Django views (no DRF): a streamed answer is
relayed chunk by chunk from the worker's reply list (training.services.serving) without a thread per
request.
"""

from __future__ import annotations

import asyncio
import json
import time

import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.authtoken.models import Token
from rest_framework.response import Response

from artweb.api import WriteApi
from artweb.api_errors import ErrorSerializer
from artweb.jsonlimits import JSONLimitError, json_loads_limited
from training import selectors
from training.services import serving
from training.services.serving import ServeError
from training.services.serving_aliases import checkpoint_alias_delete, checkpoint_alias_set

_clients: dict[int, aioredis.Redis] = {}


def _aredis() -> aioredis.Redis:
    """One client per event loop (a pool's connections belong to the loop that opened them)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(id(loop))
    if client is None:
        client = _clients[id(loop)] = aioredis.Redis.from_url(settings.REDIS_URL, socket_timeout=30)
    return client


def _error(exc: ServeError) -> JsonResponse:
    return JsonResponse(exc.as_dict(), status=exc.status)


def _user_for(request):
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


def _prepare(request, raw: bytes) -> tuple[serving.ServeTarget, dict]:
    user = _user_for(request)
    try:
        body = json_loads_limited(raw or b"null")
    except JSONLimitError as exc:
        raise ServeError(400, str(exc)) from None
    except ValueError:
        raise ServeError(400, "The request body is not JSON.") from None
    body = serving.serve_body_check(body)
    target = serving.serve_model_resolve(user=user, name=body.get("model"))
    return target, body


_prepare_async = sync_to_async(_prepare, thread_sensitive=False)
_user_async = sync_to_async(_user_for, thread_sensitive=False)


def _rename(chunk: bytes, name: str) -> bytes:
    try:
        data = json.loads(chunk)
    except ValueError:
        return chunk
    if isinstance(data, dict) and "model" in data:
        data["model"] = name
    return json.dumps(data, separators=(",", ":")).encode()


@csrf_exempt
async def chat_completions(request):
    if request.method != "POST":
        return _error(ServeError(405, "Use POST for chat completions."))
    try:
        target, body = await _prepare_async(request, request.body)
    except ServeError as exc:
        return _error(exc)
    conn = _aredis()
    if not await conn.exists(serving.ALIVE_KEY):
        return _error(serving._no_worker(target))
    request_id, payload = serving._request_payload(target, body)
    reply = serving.REPLY_KEY.format(request_id=request_id)
    queue = serving.QUEUE_KEY.format(base_model_id=target.base_model_id)
    await conn.rpush(queue, payload)
    timeout = float(settings.ARTWEB["SERVE_TIMEOUT_SECONDS"])
    deadline = time.monotonic() + timeout
    claimed = False

    async def pop():
        # Short blocking pops until the deadline: one pop never outlasts the connection's socket timeout.
        while (left := deadline - time.monotonic()) > 0:
            item = await conn.blpop([reply], timeout=max(0.05, min(left, 10)))
            if item is not None:
                return item
        return None

    async def cancel():
        await conn.set(serving.CANCEL_KEY.format(request_id=request_id), 1, ex=serving.REPLY_TTL_S)

    # Wait for the worker's verdict: started (b"s"), an error (b"x"), or nothing in time.
    while True:
        item = await pop()
        if item is None:
            if not claimed and await conn.lrem(queue, 1, payload):
                return _error(ServeError(503, f"No worker took the request within {timeout:g} s; try again."))
            await cancel()
            return _error(ServeError(504, "The worker did not answer in time."))
        kind, rest = item[1][:1], item[1][1:]
        if kind == b"c":
            claimed = True
        elif kind == b"x":
            error = json.loads(rest)
            return _error(ServeError(error["status"], error["message"], code=error.get("code")))
        elif kind == b"s":
            break

    if not body.get("stream"):
        item = await pop()
        if item is None or item[1][:1] != b"b":
            await cancel()
            return _error(ServeError(502, "The worker's answer was cut off."))
        return HttpResponse(_rename(item[1][1:], target.requested), content_type="application/json")

    async def events():
        finished = False
        try:
            while True:
                item = await pop()
                if item is None:
                    break
                kind, rest = item[1][:1], item[1][1:]
                if kind == b"d":
                    if rest.strip() == b"[DONE]":
                        yield b"data: [DONE]\n\n"
                    else:
                        yield b"data: " + _rename(rest, target.requested) + b"\n\n"
                elif kind == b"x":
                    yield b"data: " + json.dumps(ServeError(**_kw(json.loads(rest))).as_dict()).encode() + b"\n\n"
                elif kind == b"e":
                    finished = True
                    break
        finally:
            if not finished:
                await cancel()  # the caller went away, or the worker fell silent: stop generating

    response = StreamingHttpResponse(events(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def _valid(serializer_class, data) -> dict:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def _kw(error: dict) -> dict:
    return {"status": error["status"], "message": error["message"], "code": error.get("code")}


async def models_list(request):
    try:
        user = await _user_async(request)
    except ServeError as exc:
        return _error(exc)
    data = await sync_to_async(serving.serve_model_list, thread_sensitive=False)(user=user)
    return JsonResponse({"object": "list", "data": data})


# --- aliases (the rest of the API's conventions) ---------------------------------------------------


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
