"""API tokens: one per user (DRF's authtoken), created (or replaced) and revoked by its owner.

Create it with your password (HTTP Basic) or a logged-in browser session; the key is shown once.
The admin lists and deletes tokens too (Auth Token → Tokens).
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.response import Response

from artweb.api import Api, WriteApi
from artweb.api_errors import ErrorSerializer
from artweb.auth import LockoutBasicAuthentication
from training.selectors import api_token_get
from training.services.tokens import api_token_create, api_token_revoke


class TokenCreateApi(WriteApi):
    """Create your API token (replacing any previous one). Authenticate with username and password
    (HTTP Basic), your browser session, or your current token."""

    # Failed passwords count towards the sign-in lockout (artweb.auth), as on the sign-in form.
    authentication_classes = (LockoutBasicAuthentication, SessionAuthentication, TokenAuthentication)
    throttle_scope = "tokens"

    class OutputSerializer(serializers.Serializer):
        key = serializers.CharField(help_text="Send as 'Authorization: Token <key>'. Shown only now.")
        created = serializers.DateTimeField()

    @extend_schema(
        operation_id="tokens_create",
        request=None,
        responses={201: OutputSerializer, 401: ErrorSerializer, 429: ErrorSerializer},
    )
    def post(self, request):
        token = api_token_create(user=request.user)
        return Response(self.OutputSerializer(token).data, status=201)


class TokenDetailApi(Api):
    """Whether you have a token, and its first characters (never the whole key)."""

    class OutputSerializer(serializers.Serializer):
        exists = serializers.BooleanField()
        prefix = serializers.CharField(allow_null=True)
        created = serializers.DateTimeField(allow_null=True)

    @extend_schema(operation_id="tokens_current", responses={200: OutputSerializer})
    def get(self, request):
        token = api_token_get(user=request.user)
        return Response(
            self.OutputSerializer(
                {
                    "exists": token is not None,
                    "prefix": token.key[:6] if token else None,
                    "created": token.created if token else None,
                }
            ).data
        )


class TokenRevokeApi(WriteApi):
    """Revoke your token: requests with it are refused from now on."""

    throttle_scope = "tokens"

    class OutputSerializer(serializers.Serializer):
        revoked = serializers.BooleanField(help_text="False when there was no token.")

    @extend_schema(operation_id="tokens_revoke", request=None, responses={200: OutputSerializer})
    def post(self, request):
        return Response(self.OutputSerializer({"revoked": api_token_revoke(user=request.user)}).data)
