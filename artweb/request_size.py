"""An ASGI middleware that refuses request bodies over settings.ARTWEB_MAX_REQUEST_MB with a 413.

Django's ASGI handler reads the whole body (spooling it to a temporary file) before any view or
Django middleware runs, so a limit there comes too late to spare the disk and the bandwidth. This one
answers from the Content-Length header before reading anything, and counts the bytes of a body sent
without one (chunked) and stops reading at the limit.
"""

from __future__ import annotations

import json

from django.conf import settings

MIB = 1024 * 1024


def _too_large(limit_mb: int) -> str:
    return (
        f"The request body is larger than {limit_mb} MiB, the limit set by ARTWEB_MAX_REQUEST_MB. "
        "Send less, or ask the operator to raise the limit."
    )


class RequestSizeLimit:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit_mb = settings.ARTWEB_MAX_REQUEST_MB  # read per request, so tests can override it
        limit = limit_mb * MIB
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            return await self._refuse(scope, send, limit_mb)

        received = 0
        over = False
        started = False

        async def limited_receive():
            nonlocal received, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Django takes a disconnect as an aborted request: it stops reading and answers nothing.
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def tracked_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, limited_receive, tracked_send)
        if over and not started:
            await self._refuse(scope, send, limit_mb)

    @staticmethod
    async def _refuse(scope, send, limit_mb: int) -> None:
        message = _too_large(limit_mb)
        if scope.get("path", "").startswith("/api/"):
            body = json.dumps({"message": message, "field_errors": {}}).encode()
            content_type = b"application/json"
        else:
            body, content_type = message.encode(), b"text/plain; charset=utf-8"
        # "close": the rest of the body is never read, so the connection cannot carry another request.
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", content_type),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
