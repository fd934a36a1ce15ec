"""Export secrets at rest: Fernet (AES-128-CBC + HMAC-SHA256) under a key derived from SECRET_KEY.

Rotating SECRET_KEY keeps old secrets readable while the old key is listed in SECRET_KEY_FALLBACKS;
new secrets are always written under the current key.
"""

from __future__ import annotations

import base64

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

# Distinct from every other use of SECRET_KEY, so this derived key is good for nothing else.
_INFO = b"artweb export-target secrets v1"


class SecretUnreadable(Exception):
    """The stored secret was written under a key that is no longer configured."""


def _fernet_for(secret_key: str) -> Fernet:
    raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(secret_key.encode())
    return Fernet(base64.urlsafe_b64encode(raw))


def _keys() -> MultiFernet:
    keys = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    return MultiFernet([_fernet_for(k) for k in keys])


def secret_encrypt(plaintext: str) -> str:
    return _keys().encrypt(plaintext.encode()).decode()


def secret_decrypt(token: str) -> str:
    try:
        return _keys().decrypt(token.encode()).decode()
    except InvalidToken as exc:
        raise SecretUnreadable(
            "The stored key cannot be decrypted (SECRET_KEY changed?). Enter the key again."
        ) from exc


def secret_mask(last4: str) -> str:
    """What a person sees of a stored secret: dots, and its last four characters if it is long."""
    return f"••••{last4}"
