"""The export pages with Django's test client: the form built from each kind's schema, errors under
their fields, the key write-only, and only one's own targets."""

import pytest

from artweb.launcher.embedded import free_port
from artweb.testing.factories import RunFactory
from tests.egress import egress_allow
from training.exports.selectors import export_target_secret
from training.exports.services import export_target_create
from training.models import ExportTarget

KEY = "wandbkey-0123456789abcdef-WXYZ"


@pytest.fixture
def as_user(client):
    def sign_in(user):
        client.force_login(user)
        return client

    return sign_in


@pytest.mark.parametrize(
    "kind, fields",
    [
        ("wandb", ["project", "entity", "base_url", "mode", "trajectories_per_step", "log_checkpoints"]),
        ("weave", ["project", "base_url"]),
        ("langfuse", ["host", "public_key", "include_validation"]),
    ],
)
def test_it_offers_each_kinds_settings(as_user, alice, kind, fields):
    page = as_user(alice).get(f"/exports/new/{kind}/")
    assert page.status_code == 200
    for name in fields:
        assert f'name="{name}"' in page.content.decode()
    assert 'type="password"' in page.content.decode()


def test_it_creates_a_target_and_shows_only_the_keys_last_four(as_user, alice):
    run = RunFactory(owner=alice)
    client = as_user(alice)
    response = client.post(
        "/exports/new/wandb/",
        {
            "run": run.id,
            "project": "my-agent",
            "mode": "online",
            "trajectories_per_step": "4",
            "secret": KEY,
            "enabled": "on",
        },
    )
    target = ExportTarget.objects.get(owner=alice)
    assert response.status_code == 302 and response["Location"] == f"/exports/{target.id}/"
    assert target.run == run and target.settings["trajectories_per_step"] == 4 and target.enabled
    for url in ("/exports/", f"/exports/{target.id}/"):
        html = client.get(url).content.decode()
        assert "••••WXYZ" in html and "0123456789" not in html


def test_it_shows_the_schemas_message_under_the_field(as_user, alice):
    response = as_user(alice).post("/exports/new/wandb/", {"project": "has spaces", "mode": "online"})
    assert response.status_code == 200
    assert 'id="id_project_errors"' in response.content.decode()
    assert "use letters, digits" in response.content.decode()
    assert not ExportTarget.objects.exists()


def test_saving_without_a_key_keeps_it_and_the_checkbox_removes_it(as_user, alice):
    target = export_target_create(owner=alice, kind="wandb", settings={"project": "p"}, secret=KEY)
    client = as_user(alice)
    form = {"project": "q", "mode": "online", "enabled": "on", "secret": ""}
    assert client.post(f"/exports/{target.id}/", form).status_code == 302
    target.refresh_from_db()
    assert target.settings["project"] == "q" and export_target_secret(target) == KEY
    client.post(f"/exports/{target.id}/", {**form, "clear_secret": "on"})
    target.refresh_from_db()
    assert target.secret_encrypted == "" and export_target_secret(target) == ""


def test_the_test_button_says_what_the_service_answered(as_user, alice, settings):
    url = egress_allow(settings, f"http://127.0.0.1:{free_port()}")
    target = export_target_create(
        owner=alice, kind="langfuse", settings={"host": url, "public_key": "pk"}, secret="sk-lf-secret-1234"
    )
    page = as_user(alice).post(f"/exports/{target.id}/test/", follow=True).content.decode()
    assert f"Test event failed: Langfuse at {url} is unreachable" in page
    assert "sk-lf-secret-1234" not in page


def test_another_users_target_is_not_found(as_user, alice, bob):
    target = export_target_create(owner=alice, kind="wandb", settings={"project": "p"}, secret=KEY)
    client = as_user(bob)
    assert client.get(f"/exports/{target.id}/").status_code == 404
    assert client.post(f"/exports/{target.id}/", {"project": "mine", "mode": "online"}).status_code == 404
    assert client.post(f"/exports/{target.id}/test/").status_code == 404
    assert client.post(f"/exports/{target.id}/delete/").status_code == 404
    assert f"/exports/{target.id}/" not in client.get("/exports/").content.decode()
    assert ExportTarget.objects.filter(id=target.id, settings__project="p").exists()


def test_it_deletes_a_target(as_user, alice):
    target = export_target_create(owner=alice, kind="weave", settings={"project": "team/agents"})
    response = as_user(alice).post(f"/exports/{target.id}/delete/", follow=True)
    assert "Weave export for all your runs deleted." in response.content.decode()
    assert not ExportTarget.objects.exists()
