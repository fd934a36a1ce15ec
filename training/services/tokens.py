"""API tokens: one per user (DRF's authtoken), created (or replaced) and revoked by its owner."""

from __future__ import annotations

from django.db import transaction
from rest_framework.authtoken.models import Token


@transaction.atomic
def api_token_create(*, user) -> Token:
    """A new key for the user; the previous one (if any) stops working."""
    Token.objects.filter(user=user).delete()
    return Token.objects.create(user=user)


def api_token_revoke(*, user) -> bool:
    """Delete the user's token; False when there was none."""
    deleted, _ = Token.objects.filter(user=user).delete()
    return deleted > 0
