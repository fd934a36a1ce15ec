"""A SECRET_KEY rotation loses no stored secret: `manage.py rotate_secrets` (run by the launcher at every
start) re-encrypts export and judge secrets under the current key while the old one is a fallback."""

from io import StringIO

import pytest
from django.core.management import call_command

from training.exports.crypto import LEGACY_DEFAULT_KEY, SecretUnreadable, secret_decrypt, secret_encrypt
from training.exports.selectors import export_target_secret
from training.exports.services import export_target_create
from training.models import ExportTarget, JudgeEndpoint

OLD, NEW, LOST = "old-key-" * 7, "new-key-" * 7, "lost-key-" * 7


def _stored(alice):
    target = export_target_create(owner=alice, kind="wandb", settings={"project": "p"}, secret="wandb-0123456789abcd")
    judge = JudgeEndpoint.objects.create(
        owner=alice,
        name="judge",
        base_url="https://judge.example.com/v1",
        model="m",
        key_encrypted=secret_encrypt("judge-key-5678"),
    )
    return target, judge


def _rotate() -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("rotate_secrets", stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def _readable(target, judge) -> tuple[str, str]:
    target = ExportTarget.objects.get(id=target.id)
    judge = JudgeEndpoint.objects.get(id=judge.id)
    return export_target_secret(target), secret_decrypt(judge.key_encrypted)


def test_it_reencrypts_every_secret_under_the_current_key(alice, settings):
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = OLD, []
    target, judge = _stored(alice)
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = NEW, [OLD]
    assert "2 stored secret(s) re-encrypted" in _rotate()[0]
    settings.SECRET_KEY_FALLBACKS = []  # the old key is gone: what was stored is still readable
    assert _readable(target, judge) == ("wandb-0123456789abcd", "judge-key-5678")
    assert "0 stored secret(s) re-encrypted" in _rotate()[0]  # a second run changes nothing


def test_it_moves_secrets_saved_under_the_old_built_in_key(alice, settings):
    """Installations that ran with the former public default key keep their secrets, now under their own."""
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = LEGACY_DEFAULT_KEY, []
    target, judge = _stored(alice)
    settings.SECRET_KEY = NEW
    with pytest.raises(SecretUnreadable):  # the legacy key never reads a secret outside the rotation
        secret_decrypt(JudgeEndpoint.objects.get(id=judge.id).key_encrypted)
    assert "2 stored secret(s) re-encrypted" in _rotate()[0]
    assert _readable(target, judge) == ("wandb-0123456789abcd", "judge-key-5678")
    settings.SECRET_KEY = LEGACY_DEFAULT_KEY
    with pytest.raises(SecretUnreadable):  # nothing stored opens under the public key any more
        secret_decrypt(JudgeEndpoint.objects.get(id=judge.id).key_encrypted)


def test_it_leaves_a_secret_under_an_unknown_key_as_it_is_and_says_so(alice, settings):
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = LOST, []
    target, _ = _stored(alice)
    before = ExportTarget.objects.get(id=target.id).secret_encrypted
    settings.SECRET_KEY = NEW
    out, err = _rotate()
    assert "0 stored secret(s) re-encrypted" in out
    assert "2 stored secret(s) open under no configured key" in err and "SECRET_KEY_FALLBACKS" in err
    assert ExportTarget.objects.get(id=target.id).secret_encrypted == before
