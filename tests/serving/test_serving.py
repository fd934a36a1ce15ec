"""Which model a name means on the OpenAI endpoint, for whom; aliases; the request checks."""

import pytest
from django.http import Http404

from artweb.errors import ApplicationError
from artweb.testing.factories import BaseModelFactory, CheckpointFactory, RunFactory, UserFactory
from training.models import Checkpoint
from training.serving.protocol import ServeError
from training.serving.selectors import serve_model_list, serve_model_resolve
from training.serving.services.aliases import checkpoint_alias_delete, checkpoint_alias_set
from training.serving.services.serving import serve_body_check

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice():
    return UserFactory(username="alice")


@pytest.fixture
def bob():
    return UserFactory(username="bob")


@pytest.fixture
def run(alice):
    run = RunFactory(owner=alice, name="writer", base_model=BaseModelFactory(owner=None, name="shared-model"))
    CheckpointFactory(run=run, step=1, val_reward=0.2)
    CheckpointFactory(run=run, step=2, val_reward=0.9)
    CheckpointFactory(run=run, step=3, val_reward=None)
    CheckpointFactory(run=run, step=4, val_reward=0.95, state=Checkpoint.State.DELETED)
    return run


def _step(user, name):
    target = serve_model_resolve(user=user, name=name)
    return int(target.adapter_name.rsplit("@", 1)[1]) if target.adapter_name else None


def test_it_resolves_steps_best_latest_by_id_and_by_name(alice, run):
    assert _step(alice, f"run-{run.id}@1") == 1
    assert _step(alice, f"{run.id}@2") == 2
    assert _step(alice, "writer@latest") == 3  # step 4's files are deleted
    assert _step(alice, f"run-{run.id}@best") == 2  # the best validation reward among the kept ones
    target = serve_model_resolve(user=alice, name=f"run-{run.id}@1")
    assert target.adapter_name == f"run-{run.id}@1" and target.base_model_id == run.base_model_id
    assert target.requested == f"run-{run.id}@1"
    assert serve_model_resolve(user=alice, name="shared-model").adapter_name is None


@pytest.mark.parametrize("name", ["run-{id}@4", "run-{id}@9", "nobody@latest", "no-such-model", "@1"])
def test_it_answers_404_for_what_is_not_there(alice, run, name):
    with pytest.raises(ServeError) as caught:
        serve_model_resolve(user=alice, name=name.format(id=run.id))
    assert caught.value.status == 404 and caught.value.as_dict()["error"]["code"] == "model_not_found"


def test_another_users_checkpoints_and_private_models_are_404_but_shared_models_are_not(alice, bob, run):
    private = BaseModelFactory(owner=alice, name="alices-model")
    for name in (f"run-{run.id}@1", f"run-{run.id}@best", "writer@latest", private.name):
        with pytest.raises(ServeError) as caught:
            serve_model_resolve(user=bob, name=name)
        assert caught.value.status == 404
    assert serve_model_resolve(user=bob, name="shared-model").base_model_id == run.base_model_id
    assert {m["id"] for m in serve_model_list(user=bob)} == {"shared-model"}
    mine = {m["id"] for m in serve_model_list(user=alice)}
    assert {"shared-model", private.name, f"run-{run.id}@latest", f"run-{run.id}@best", f"run-{run.id}@3"} <= mine
    assert f"run-{run.id}@4" not in mine


def test_a_step_that_is_not_a_number_says_what_to_write(alice, run):
    with pytest.raises(ServeError) as caught:
        serve_model_resolve(user=alice, name=f"run-{run.id}@first")
    assert caught.value.status == 400 and "<run>@best" in caught.value.message


def test_an_alias_names_a_checkpoint_promotes_it_and_can_move_or_go(alice, bob, run):
    one, two = Checkpoint.objects.get(run=run, step=1), Checkpoint.objects.get(run=run, step=2)
    checkpoint_alias_set(checkpoint=one, name="writer-v1", actor=alice)
    one.refresh_from_db()
    assert one.promoted and _step(alice, "writer-v1") == 1
    checkpoint_alias_set(checkpoint=two, name="writer-v1", actor=alice)  # moves
    assert _step(alice, "writer-v1") == 2
    assert "writer-v1" in {m["id"] for m in serve_model_list(user=alice)}
    with pytest.raises(ServeError):
        serve_model_resolve(user=bob, name="writer-v1")  # aliases are their owner's names
    with pytest.raises(Http404):
        checkpoint_alias_set(checkpoint=two, name="bobs", actor=bob)
    checkpoint_alias_delete(checkpoint=two, name="writer-v1", actor=alice)
    with pytest.raises(ServeError):
        serve_model_resolve(user=alice, name="writer-v1")
    assert run.events.filter(kind="checkpoint_alias").count() == 2


@pytest.mark.parametrize("name", ["", "has space", "a@1", "-dash-first", "x" * 101, "shared-model"])
def test_an_alias_must_be_a_plain_name_no_model_has(alice, run, name):
    with pytest.raises(ApplicationError) as caught:
        checkpoint_alias_set(checkpoint=Checkpoint.objects.get(run=run, step=1), name=name, actor=alice)
    assert "alias" in caught.value.field_errors


@pytest.mark.parametrize(
    "body, param",
    [
        ([], None),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 17}, "n"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": True}, "n"),
    ],
)
def test_a_request_that_cannot_be_served_says_what_to_fix(body, param):
    with pytest.raises(ServeError) as caught:
        serve_body_check(body)
    assert caught.value.status == 400 and caught.value.param == param


def test_staff_give_an_alias_in_the_admin_and_it_is_the_owners(client, staff, alice, run):
    one = Checkpoint.objects.get(run=run, step=1)
    client.force_login(staff)
    response = client.post("/admin/serving/checkpointalias/add/", {"name": "from-admin", "checkpoint": one.id})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert _step(alice, "from-admin") == 1
    one.refresh_from_db()
    assert one.promoted
    bad = client.post("/admin/serving/checkpointalias/add/", {"name": "has space", "checkpoint": one.id})
    assert bad.status_code == 200 and "An alias is 1 to 100 letters" in bad.content.decode()


def test_staff_may_alias_anyones_checkpoint_but_names_resolve_among_ones_own(alice, bob, staff, run):
    """Names on the endpoint are looked up among the caller's own (artweb.visibility.own), staff's too:
    run names are not unique across people. Who may change a checkpoint's alias is the one rule."""
    one = Checkpoint.objects.get(run=run, step=1)
    alias = checkpoint_alias_set(checkpoint=one, name="writer-v1", actor=staff)
    assert alias.owner == alice and _step(alice, "writer-v1") == 1
    for name in ("writer-v1", f"run-{run.id}@1", "writer@latest"):
        with pytest.raises(ServeError):
            serve_model_resolve(user=staff, name=name)
    assert {m["id"] for m in serve_model_list(user=staff)} == {"shared-model"}
    with pytest.raises(Http404):
        checkpoint_alias_delete(checkpoint=one, name="writer-v1", actor=bob)
    checkpoint_alias_delete(checkpoint=one, name="writer-v1", actor=staff)
    with pytest.raises(ServeError):
        serve_model_resolve(user=alice, name="writer-v1")
