"""Runs and base models in the admin go through their services: a run's status moves only by a transition
that records the staff member, an edit of its name is an event, and a base model's source rules hold there
as they do on the API and the models page; every model is named in the plural as English spells it."""

import re

from django.apps import apps
from django.urls import reverse

from artweb.testing.factories import RunFactory
from artweb.testing.model_cache import link_model
from training.models import PretrainedModel, Run, RunEvent


def test_it_shows_a_runs_status_read_only_and_records_an_edit_of_its_name(client, staff, alice):
    run = RunFactory(owner=alice, status=Run.Status.RUNNING)
    old_name = run.name
    client.force_login(staff)
    url = reverse("admin:training_run_change", args=[run.id])
    assert client.get(url).status_code == 200
    response = client.post(url, {"name": "renamed", "tags": "a,b", "status": "completed"})
    assert response.status_code == 302, response.content.decode()[-2000:]
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING and run.name == "renamed" and run.tags == ["a", "b"]
    event = RunEvent.objects.get(run=run, kind="edited")
    assert event.actor == staff
    assert event.data == {"name": {"from": old_name, "to": "renamed"}, "tags": {"from": [], "to": ["a", "b"]}}


def test_its_cancel_action_is_the_cancel_service_with_the_staff_member_as_actor(client, staff, alice):
    queued = RunFactory(owner=alice, status=Run.Status.QUEUED)
    done = RunFactory(owner=alice, status=Run.Status.COMPLETED)
    client.force_login(staff)
    response = client.post(
        reverse("admin:training_run_changelist"),
        {"action": "cancel_runs", "_selected_action": [queued.id, done.id]},
        follow=True,
    )
    assert response.status_code == 200
    queued.refresh_from_db()
    done.refresh_from_db()
    assert queued.status == Run.Status.CANCELLED and done.status == Run.Status.COMPLETED
    event = RunEvent.objects.get(run=queued, kind="status")
    assert event.actor == staff and event.data == {"from": "queued", "to": "cancelled"}
    assert "already completed" in response.content.decode()  # the service's refusal, shown
    assert client.get(reverse("admin:training_run_add")).status_code == 403  # runs are launched, not added


def test_it_applies_the_base_model_source_rules_in_the_admin(client, staff, tmp_path, vllm_model_dir):
    client.force_login(staff)
    form = {"name": "local", "source": str(tmp_path), "revision": "", "max_length": 2048, "recommended_train": "{}"}
    response = client.post(reverse("admin:training_pretrainedmodel_add"), form)
    assert response.status_code == 200 and "not a model directory" in response.content.decode()
    assert not PretrainedModel.objects.filter(name="local").exists()
    link_model(vllm_model_dir, tmp_path)  # the default model's files in it
    response = client.post(reverse("admin:training_pretrainedmodel_add"), form)
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert PretrainedModel.objects.get(name="local").source == str(tmp_path)


def test_it_names_each_model_in_the_plural_as_english_does(client, staff):
    """The admin's index says "Trajectories" and "Checkpoint aliases"; no model of the project's apps keeps
    Django's default plural (verbose name + "s") where English spells it otherwise."""
    client.force_login(staff)
    page = client.get(reverse("admin:index")).content.decode()
    assert "Trajectories" in page and "Checkpoint aliases" in page
    assert "Trajectorys" not in page and "aliass" not in page
    wrong = []
    for model in apps.get_models():
        meta = model._meta
        if meta.app_label not in {"training", "serving", "client_runs", "rollouts"}:
            continue
        name, plural = str(meta.verbose_name), str(meta.verbose_name_plural)
        naive = plural == name + "s"
        if naive and (re.search(r"(s|x|z|ch|sh)$", name) or re.search(r"[^aeiou]y$", name)):
            wrong.append(f"{meta.label}: {plural}")
    assert wrong == []
