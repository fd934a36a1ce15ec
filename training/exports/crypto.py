"""Export and judge secrets at rest: Fernet (AES-128-CBC + HMAC-SHA256) under a key derived from SECRET_KEY.

Rotating SECRET_KEY keeps old secrets readable while the old key is listed in SECRET_KEY_FALLBACKS;
new secrets are always written under the current key, and secrets_rotate (`manage.py rotate_secrets`,
run by the launcher at every start) re-encrypts the stored ones under it, so the fallback can go.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

from training.models import ExportTarget, JudgeEndpoint, UserSecret

# Distinct from every other use of SECRET_KEY, so this derived key is good for nothing else.
_INFO = b"artweb export-target secrets v1"
# The SECRET_KEY that versions before the key file used when none was set. It was public, so it never
# signs or encrypts anything; secrets_rotate reads secrets saved under it once, to re-encrypt them under
# the current key, so an existing installation keeps them.
LEGACY_DEFAULT_KEY = "artweb-insecure-development-key-never-use-in-production"
# Every column that holds a secret_encrypt token.
ENCRYPTED_FIELDS = (
    (ExportTarget, "secret_encrypted"),
    (JudgeEndpoint, "key_encrypted"),
    (UserSecret, "value_encrypted"),
)


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


@dataclass(frozen=True)
class RotateResult:
    rotated: int  # re-encrypted under the current key
    unreadable: int  # opened by no configured key: left as they are, their owners must enter them again


def secrets_rotate() -> RotateResult:
    """Re-encrypt under the current SECRET_KEY every stored secret written under another key (one in
    SECRET_KEY_FALLBACKS, or the legacy default). Each row is updated only if it still holds the token
    that was read, so a secret saved meanwhile is never overwritten; running it again changes nothing."""
    current = _fernet_for(settings.SECRET_KEY)
    readers = MultiFernet(
        [current, *(_fernet_for(k) for k in settings.SECRET_KEY_FALLBACKS), _fernet_for(LEGACY_DEFAULT_KEY)]
    )
    rotated = unreadable = 0
    for model, field in ENCRYPTED_FIELDS:
        for pk, token in model.objects.exclude(**{field: ""}).values_list("pk", field).iterator():
            try:
                current.decrypt(token.encode())
                continue  # already under the current key
            except InvalidToken:
                pass
            try:
                new = readers.rotate(token.encode()).decode()
            except InvalidToken:
                unreadable += 1
                continue
            rotated += model.objects.filter(pk=pk, **{field: token}).update(**{field: new})
    return RotateResult(rotated=rotated, unreadable=unreadable)


def secret_mask(last4: str) -> str:
    """What a person sees of a stored secret: dots, and its last four characters if it is long."""
    return f"••••{last4}"
