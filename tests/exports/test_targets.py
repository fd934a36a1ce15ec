"""Export targets: keys encrypted at rest and never shown back, per-user defaults and per-run overrides."""

import pytest
from django.test import override_settings

from artweb.errors import ApplicationError
from artweb.testing.factories import RunFactory
from training.exports.crypto import SecretUnreadable, secret_decrypt, secret_encrypt
from training.exports.selectors import export_target_public, export_target_secret, export_targets_for_run
from training.exports.services import export_target_create, export_target_update
from training.models import ExportTarget


def test_it_stores_the_key_encrypted_and_shows_only_its_last_four(alice):
    target = export_target_create(
        owner=alice, kind="wandb", settings={"project": "p"}, secret="wandb-key-0123456789abcd"
    )
    row = ExportTarget.objects.get(id=target.id)
    assert "0123456789" not in row.secret_encrypted and row.secret_encrypted
    assert export_target_secret(row) == "wandb-key-0123456789abcd"
    public = export_target_public(row)
    assert public["secret"] == "••••abcd" and public["secret_source"] == "stored"
    assert "wandb-key" not in str(public)


def test_a_short_key_shows_nothing_of_itself(alice):
    target = export_target_create(owner=alice, kind="wandb", settings={"project": "p"}, secret="abc12")
    assert export_target_public(target)["secret"] == "••••"


def test_without_a_stored_key_the_workers_environment_supplies_the_operators_own(staff, alice, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "from-the-env")
    target = export_target_create(owner=staff, kind="wandb", settings={"project": "p"})
    assert export_target_secret(target) == "from-the-env"
    assert export_target_public(target)["secret_source"] == "worker environment"
    users = export_target_create(owner=alice, kind="wandb", settings={"project": "p"})
    assert export_target_secret(users) == ""
    assert export_target_public(users)["secret_source"] == "none"


def test_keys_survive_a_secret_key_rotation_with_fallbacks():
    with override_settings(SECRET_KEY="old-key-" * 6):
        token = secret_encrypt("s3cret")
    with override_settings(SECRET_KEY="new-key-" * 6, SECRET_KEY_FALLBACKS=["old-key-" * 6]):
        assert secret_decrypt(token) == "s3cret"
    with (
        override_settings(SECRET_KEY="new-key-" * 6, SECRET_KEY_FALLBACKS=[]),
        pytest.raises(SecretUnreadable, match="Enter the key again"),
    ):
        secret_decrypt(token)


def test_update_keeps_clears_or_replaces_the_key(alice):
    target = export_target_create(owner=alice, kind="langfuse", secret="sk-lf-aaaa1111")
    export_target_update(target=target, actor=alice, settings={"public_key": "pk"})
    assert export_target_secret(target) == "sk-lf-aaaa1111"
    export_target_update(target=target, actor=alice, secret="sk-lf-bbbb2222")
    assert export_target_public(target)["secret"] == "••••2222"
    export_target_update(target=target, actor=alice, secret="")
    assert target.secret_encrypted == "" and export_target_public(target)["secret"] == ""


def test_settings_are_validated_naming_the_field(alice):
    with pytest.raises(ApplicationError) as exc:
        export_target_create(owner=alice, kind="wandb", settings={"project": "has spaces"})
    assert "settings.project" in exc.value.field_errors
    with pytest.raises(ApplicationError):
        export_target_create(owner=alice, kind="weave", settings={"project": "no-entity"})
    with pytest.raises(ApplicationError):
        export_target_create(owner=alice, kind="datadog", settings={})


def test_a_run_target_overrides_the_owners_and_can_opt_the_run_out(alice):
    run, other = RunFactory(owner=alice), RunFactory(owner=alice)
    default = export_target_create(owner=alice, kind="wandb", settings={"project": "all"})
    special = export_target_create(owner=alice, kind="wandb", settings={"project": "special"}, run=run)
    lf = export_target_create(owner=alice, kind="langfuse", run=run, enabled=False)
    assert export_targets_for_run(run=run) == [special]
    assert export_targets_for_run(run=other) == [default]
    assert lf in export_targets_for_run(run=run, include_disabled=True)
    with pytest.raises(ApplicationError, match="already"):
        export_target_create(owner=alice, kind="wandb", settings={"project": "again"})


def test_nobody_configures_exports_for_someone_elses_run(alice, bob):
    run = RunFactory(owner=alice)
    with pytest.raises(ApplicationError, match="not yours"):
        export_target_create(owner=bob, kind="wandb", settings={"project": "p"}, run=run)
    target = export_target_create(owner=alice, kind="wandb", settings={"project": "p"})
    with pytest.raises(ApplicationError, match="not yours"):
        export_target_update(target=target, actor=bob, enabled=False)
    assert export_targets_for_run(run=RunFactory(owner=bob)) == []
