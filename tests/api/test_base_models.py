"""Base models: the shared ones and the user's own; registration by Hugging Face id."""

import pytest

from artweb.testing.model_cache import DEFAULT_REPO_ID
from tests.api.conftest import assert_error
from training.models import PretrainedModel

pytestmark = pytest.mark.django_db


def test_it_lists_shared_and_own_models_only(alice_api, alice, bob):
    PretrainedModel.objects.create(name="shared", source="org/shared")
    PretrainedModel.objects.create(name="alices", source="org/a", owner=alice)
    PretrainedModel.objects.create(name="bobs", source="org/b", owner=bob)
    names = {(m["name"], m["shared"]) for m in alice_api.get("/api/v1/base-models/").json()["results"]}
    assert names == {("shared", True), ("alices", False)}


def test_it_registers_a_model_idempotently(alice_api, alice, hub_model):
    hub_model(DEFAULT_REPO_ID)
    payload = {"name": "smol", "source": DEFAULT_REPO_ID, "max_length": 4096}
    first = alice_api.post("/api/v1/base-models/register/", payload, format="json")
    assert first.status_code == 201 and first.json()["max_length"] == 4096
    again = alice_api.post("/api/v1/base-models/register/", payload, format="json")
    assert again.json()["id"] == first.json()["id"]
    assert PretrainedModel.objects.get().owner == alice


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"name": "m", "source": "org/m", "max_length": 8}, "max_length"),
        ({"name": "m", "source": "org/m", "max_length": "long"}, "max_length"),
        ({"name": "", "source": "org/m"}, "name"),
        ({"name": "m"}, "source"),
        ({"name": "m", "source": "/etc"}, "source"),
        ({"name": "m", "source": "~/models"}, "source"),
        ({"name": "m", "source": "org/../../etc"}, "source"),
    ],
)
def test_it_rejects_bad_registrations(alice_api, payload, field):
    assert_error(alice_api.post("/api/v1/base-models/register/", payload, format="json"), 400, field=field)
    assert not PretrainedModel.objects.exists()


def test_a_name_taken_by_bob_is_refused_without_showing_his_model(alice_api, bob):
    PretrainedModel.objects.create(name="mine", source="bob/secret-model", owner=bob)
    response = alice_api.post(
        "/api/v1/base-models/register/", {"name": "mine", "source": "bob/secret-model"}, format="json"
    )
    assert_error(response, 400, field="name")
    assert "secret" not in response.content.decode()


def test_staff_may_register_a_server_directory(staff_api, vllm_model_dir):
    response = staff_api.post(
        "/api/v1/base-models/register/", {"name": "local", "source": str(vllm_model_dir)}, format="json"
    )
    assert response.status_code == 201, response.json()
