"""Sign-in lockout wiring: what a person locked out by django-axes sees, on the form and on the API.

Axes counts failed authenticate() calls per username and address (settings AXES_*); after
AXES_FAILURE_LIMIT of them that pair is refused for AXES_COOLOFF_TIME, even with the right password,
and every further try during the lockout starts the cool-off again.
"""

from __future__ import annotations

import math

from axes.utils import reset
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from drf_spectacular.authentication import BasicScheme
from rest_framework import exceptions
from rest_framework.authentication import BasicAuthentication

from artweb.api_errors import SignInLockedOut


def client_ip(request: HttpRequest) -> str | None:
    """AXES_CLIENT_IP_CALLABLE: the address the ASGI server gives the connection (REMOTE_ADDR). That is a
    forwarded address only when the peer is a proxy listed in ARTWEB_TRUSTED_PROXIES (the launcher starts
    uvicorn so), never one a client writes into X-Forwarded-For itself."""
    return request.META.get("REMOTE_ADDR")


def cool_off_minutes() -> int:
    return max(1, math.ceil(settings.AXES_COOLOFF_TIME.total_seconds() / 60))


def lockout_message() -> str:
    minutes = cool_off_minutes()
    return f"Too many failed sign-ins; try again in {minutes} minute{'s' if minutes != 1 else ''}."


def lockout_response(request: HttpRequest, original_response=None, credentials=None) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: the sign-in page again with the lockout message, or the API's error shape."""
    retry_after = str(cool_off_minutes() * 60)
    if request.path.startswith("/api/"):
        response = JsonResponse(
            {"message": lockout_message(), "field_errors": {}}, status=settings.AXES_HTTP_RESPONSE_CODE
        )
    else:
        response = render(
            request,
            "registration/login.html",
            {
                "form": AuthenticationForm(request, initial={"username": request.POST.get("username", "")}),
                "lockout_message": lockout_message(),
                "next": request.POST.get("next") or request.GET.get("next", ""),
            },
            status=settings.AXES_HTTP_RESPONSE_CODE,
        )
    response["Retry-After"] = retry_after
    return response


class LockoutBasicAuthentication(BasicAuthentication):
    """HTTP Basic for the token endpoint, answering a locked-out username with 429 instead of 401.

    DRF passes its request to authenticate(), so axes counts these failures too; but axes marks that
    request object, not the HttpRequest its middleware sees, so the lockout is turned into an answer here.
    """

    def authenticate_credentials(self, userid, password, request=None):
        try:
            result = super().authenticate_credentials(userid, password, request)
        except exceptions.AuthenticationFailed:
            if getattr(request, "axes_locked_out", False):
                raise SignInLockedOut(lockout_message(), wait=cool_off_minutes() * 60) from None
            raise
        ip_address = getattr(request, "axes_ip_address", None)
        if settings.AXES_RESET_ON_SUCCESS and ip_address:
            # The sign-in form resets on success through the user_logged_in signal; Basic auth sends none.
            reset(ip=ip_address, username=userid)
        return result


class LockoutBasicScheme(BasicScheme):
    """The OpenAPI schema describes it as plain HTTP Basic (drf-spectacular matches exact classes only)."""

    target_class = "artweb.auth.LockoutBasicAuthentication"
