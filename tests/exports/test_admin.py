"""ExportTarget in the admin: saved through the export services, the key write-only there too."""

from django.urls import reverse

from artweb.launcher.embedded import free_port
from tests.egress import egress_allow
from training.exports.selectors import export_target_secret
from training.exports.services import export_target_create
from training.models import ExportTarget

KEY = "wandbkey-0123456789abcdef-WXYZ"


def test_staff_add_and_change_a_target_without_ever_seeing_its_key(client, staff, alice):
    client.force_login(staff)
    add = client.post(
        reverse("admin:training_exporttarget_add"),
        {"owner": alice.id, "kind": "wandb", "enabled": "on", "settings": '{"project": "p"}', "new_secret": KEY},
    )
    assert add.status_code == 302, add.content.decode()[-2000:]
    target = ExportTarget.objects.get(owner=alice)
    assert export_target_secret(target) == KEY and target.settings["mode"] == "online"

    change_url = reverse("admin:training_exporttarget_change", args=[target.id])
    html = client.get(change_url).content.decode()
    assert "••••WXYZ" in html and "0123456789" not in html and target.secret_encrypted not in html
    assert "0123456789" not in client.get(reverse("admin:training_exporttarget_changelist")).content.decode()

    client.post(change_url, {"enabled": "on", "settings": '{"project": "q"}', "new_secret": ""})
    target.refresh_from_db()
    assert target.settings["project"] == "q" and export_target_secret(target) == KEY

    bad = client.post(change_url, {"enabled": "on", "settings": '{"project": "has spaces"}'})
    assert bad.status_code == 200 and "settings.project" in bad.content.decode()


def test_the_admin_action_sends_a_test_event(client, staff, alice, settings):
    target = export_target_create(
        owner=alice,
        kind="langfuse",
        secret="sk-lf-1234",
        settings={"host": egress_allow(settings, f"http://127.0.0.1:{free_port()}"), "public_key": "pk"},
    )
    client.force_login(staff)
    response = client.post(
        reverse("admin:training_exporttarget_changelist"),
        {"action": "send_test_event", "_selected_action": [target.id]},
        follow=True,
    )
    assert "is unreachable" in response.content.decode()
