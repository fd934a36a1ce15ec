"""Which run actions are allowed is decided once, by training.services.runs.run_actions: the run page's
buttons, the data its script starts from, the API's `actions` and the services themselves agree for
every status; the live status message carries the new status's actions."""

import json
import re
from html.parser import HTMLParser

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from artweb.testing.factories import RunFactory
from training.models import Run
from training.services.runs import ACTION_STATUSES, run_actions, run_status_message

pytestmark = pytest.mark.django_db
ACTIONS = list(ACTION_STATUSES)


class _Buttons(HTMLParser):
    """The run page's action buttons: {action: enabled}."""

    def __init__(self, html: str):
        super().__init__()
        self.enabled = {}
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "button" and "data-action" in attrs:
            self.enabled[attrs["data-action"]] = "disabled" not in attrs


def _api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.mark.parametrize("status", Run.Status.values)
@pytest.mark.parametrize("who", ["alice", "staff"])
def test_the_pages_buttons_and_the_api_agree(request, as_user, alice, status, who):
    user = request.getfixturevalue(who)
    run = RunFactory(owner=alice, status=status)
    html = as_user(user).get(reverse("run-detail", args=[run.id])).content.decode()
    buttons = _Buttons(html).enabled
    page_data = json.loads(re.search(r'<script id="run-data" type="application/json">(.*?)</script>', html).group(1))
    api = _api(user).get(f"/api/v1/runs/{run.id}/").json()["actions"]
    assert set(buttons) == set(ACTIONS)
    assert [a for a in ACTIONS if buttons[a]] == page_data["actions"] == api
    assert api == [a for a, statuses in ACTION_STATUSES.items() if status in statuses]
    assert run_status_message(run)["actions"] == api  # what the socket tells the page when the status changes


@pytest.mark.parametrize("status", Run.Status.values)
@pytest.mark.parametrize("action", ACTIONS)
def test_the_service_accepts_exactly_the_actions_it_reports(alice, status, action):
    run = RunFactory(owner=alice, status=status, steps_done=0)
    response = _api(alice).post(f"/api/v1/runs/{run.id}/{action}/")
    assert response.status_code == (200 if status in ACTION_STATUSES[action] else 400), response.content


def test_someone_who_may_not_see_the_run_has_no_actions_and_no_page(as_user, alice, bob):
    run = RunFactory(owner=alice, status="running")
    assert run_actions(run=run, user=alice) == ["cancel", "pause"]
    assert run_actions(run=run, user=bob) == []
    assert as_user(bob).get(reverse("run-detail", args=[run.id])).status_code == 404
    assert _api(bob).get(f"/api/v1/runs/{run.id}/").status_code == 404
