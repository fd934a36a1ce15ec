"""base_model_register holds the registration rules, whichever interface calls it. The models registered
are the default model's files: its directory, or laid out in a Hugging Face cache under a Hub id."""

import pytest

from artweb.errors import ApplicationError
from training.models import PretrainedModel
from training.services import base_model_register

pytestmark = pytest.mark.django_db


def test_it_refuses_server_paths_from_users(alice, vllm_model_dir):
    for kwargs in ({"source": str(vllm_model_dir)}, {"source": "org/m", "local_path": str(vllm_model_dir)}):
        with pytest.raises(ApplicationError, match="Only staff may register") as exc:
            base_model_register(owner=alice, name="m", **kwargs)
        assert exc.value.field_errors == {"source": ["server paths need staff"]}
    assert not PretrainedModel.objects.exists()


def test_staff_and_the_operators_commands_may_register_server_paths(staff, vllm_model_dir):
    by_staff = base_model_register(owner=staff, name="local", source=str(vllm_model_dir))
    assert by_staff.owner == staff and by_staff.local_path == str(vllm_model_dir.resolve())
    shared = base_model_register(name="shared", source=str(vllm_model_dir))
    assert shared.owner is None


def test_it_refuses_a_hub_id_that_names_a_server_directory(alice, hub_model, tmp_path, monkeypatch):
    # The loaders look for a local directory of that name before asking the Hub.
    (tmp_path / "data" / "models").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    hub_model("data/models")  # in the cache too: what refuses it is the directory of that name
    hub_model("org/models")
    with pytest.raises(ApplicationError, match="names a directory on the server"):
        base_model_register(owner=alice, name="m", source="data/models")
    assert base_model_register(owner=alice, name="m", source="org/models").source == "org/models"


def test_a_name_taken_by_another_user_is_refused_without_naming_the_source(alice, bob, hub_model):
    hub_model("bob/secret-model")
    base_model_register(owner=bob, name="mine", source="bob/secret-model")
    with pytest.raises(ApplicationError, match="is taken") as exc:
        base_model_register(owner=alice, name="mine", source="bob/secret-model")
    assert "secret" not in exc.value.message
