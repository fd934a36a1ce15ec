"""An ASGI middleware that refuses request bodies over settings.ARTWEB_MAX_REQUEST_MB with a 413 (the data
attachment uploads: over ARTWEB_ATTACHMENT_MAX_MB).

Django's ASGI handler reads the whole body (spooling it to a temporary file) before any view or
Django middleware runs, so a limit there comes too late to spare the disk and the bandwidth. This one
answers from the Content-Length header before reading anything, and counts the bytes of a body sent
without one (chunked) and stops reading at the limit.
"""

from __future__ import annotations

import json

from django.conf import settings

MIB = 1024 * 1024
# The data attachment uploads (rollouts.apis.attachments, rollouts.views): bodies up to ARTWEB_ATTACHMENT_MAX_MB
# and 1 MiB for the form's other fields, on these paths alone. Django spools such a body to a temporary file.
ATTACHMENT_UPLOAD_PATHS = ("/api/v1/attachments/create/", "/attachments/new/")


def _limit_mb(path: str) -> tuple[int, str]:
    """The body limit of a path, in MiB, and the setting that sets it."""
    if path in ATTACHMENT_UPLOAD_PATHS:
        return settings.ARTWEB_ATTACHMENT_MAX_MB + 1, "ARTWEB_ATTACHMENT_MAX_MB"
    return settings.ARTWEB_MAX_REQUEST_MB, "ARTWEB_MAX_REQUEST_MB"


def _too_large(limit_mb: int, setting: str = "ARTWEB_MAX_REQUEST_MB") -> str:
    return (
        f"The request body is larger than {limit_mb} MiB, the limit set by {setting}. "
        "Send less, or ask the operator to raise the limit."
    )


class RequestSizeLimit:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit_mb, setting = _limit_mb(scope.get("path", ""))  # read per request, so tests can override it
        limit = limit_mb * MIB
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            return await self._refuse(scope, send, limit_mb, setting)

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
            await self._refuse(scope, send, limit_mb, setting)

    @staticmethod
    async def _refuse(scope, send, limit_mb: int, setting: str) -> None:
        message = _too_large(limit_mb, setting)
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
