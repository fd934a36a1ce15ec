"""The launch form as a new user meets it: the demo task loaded, the default model registered with its
recommended settings, and nothing typed. Its defaults submit, and what it shows is what the run uses."""

import json
import re
from io import StringIO

import pytest
from django import forms
from django.core.management import call_command
from django.urls import reverse

from artweb.testing.factories import BaseModelFactory
from training.engine.default_model import RECOMMENDED_TRAIN
from training.forms import DEFAULT_LEARNING_RATE
from training.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo(alice):
    """What `make run` leaves for its admin: the example task and the default model."""
    call_command("seed_demo", owner="alice", stdout=StringIO())
    return BaseModelFactory(recommended_train=RECOMMENDED_TRAIN)


def _as_submitted(form) -> dict:
    """What a browser sends for a form nobody touched: each field's shown value, ticked boxes only."""
    data = {}
    for field in form:
        value = field.value()
        if isinstance(field.field, forms.BooleanField):
            if value:
                data[field.html_name] = "on"
        elif value is not None:
            data[field.html_name] = str(value)
    return data


def _train_placeholder(response) -> dict:
    return json.loads(response.context["form"].fields["train"].widget.attrs["placeholder"])


def test_the_forms_defaults_launch_a_run_with_a_generated_name(as_user, alice, demo):
    client = as_user(alice)
    page = client.get(reverse("run-launch"))
    data = _as_submitted(page.context["form"])
    assert data.get("name", "") == ""  # nothing typed: the name is the form's to make up

    response = client.post(reverse("run-launch"), data)
    run = Run.objects.get(owner=alice)
    assert response.status_code == 302 and response["Location"] == reverse("run-detail", args=[run.id])
    assert re.fullmatch(r"Example rollout on SmolLM2-135M-Instruct \d{4}-\d\d-\d\d \d\d:\d\d", run.name), run.name
    assert run.script_version.asset.name == "Example rollout" and run.reward_version.asset.name == "Example reward"


def test_a_typed_name_is_kept(as_user, alice, demo):
    client = as_user(alice)
    data = _as_submitted(client.get(reverse("run-launch")).context["form"])
    client.post(reverse("run-launch"), {**data, "name": "  lr sweep 1 "})
    assert Run.objects.get(owner=alice).name == "lr sweep 1"


def test_the_learning_rate_shown_is_the_one_the_run_uses(as_user, alice, demo):
    client = as_user(alice)
    page = client.get(reverse("run-launch"))
    shown = _train_placeholder(page)["learning_rate"]
    assert shown == RECOMMENDED_TRAIN["learning_rate"] == 2e-4
    assert 'placeholder="{&quot;learning_rate&quot;: 0.0002}"' in page.content.decode()
    assert page.context["hints"]["recommended"][str(demo.id)]["learning_rate"] == shown

    client.post(reverse("run-launch"), _as_submitted(page.context["form"]))
    assert Run.objects.get(owner=alice).config["train"]["learning_rate"] == shown


def test_a_model_without_recommendations_shows_artwebs_default(as_user, alice, demo):
    plain = BaseModelFactory(name="plain", source="org/plain")
    client = as_user(alice)
    data = _as_submitted(client.get(reverse("run-launch")).context["form"])
    # The form comes back (a bad value elsewhere) with the model the person chose: its rate is shown.
    response = client.post(reverse("run-launch"), {**data, "base_model": plain.id, "num_steps": 0})
    assert response.status_code == 200 and not Run.objects.exists()
    assert _train_placeholder(response)["learning_rate"] == DEFAULT_LEARNING_RATE
    assert response.context["hints"]["recommended"][str(plain.id)]["learning_rate"] == DEFAULT_LEARNING_RATE

    client.post(reverse("run-launch"), {**data, "base_model": plain.id})
    assert Run.objects.get(owner=alice).config["train"]["learning_rate"] == DEFAULT_LEARNING_RATE
