"""The Python client against a live server: one object is a dict, many are a list (every page followed)."""

from __future__ import annotations

import pytest

from artweb.client import Client
from artweb.testing.factories import RunFactory
from training.services import run_event
from training.services.logs import run_log


@pytest.fixture
def api(live_server, django_user_model):
    user = django_user_model.objects.create_user("alice", password="a long password 1")
    key = Client.token_create(live_server.url, "alice", "a long password 1")
    with Client(live_server.url, token=key) as client:
        client.user = user
        yield client


def test_collections_are_lists_and_single_objects_dicts(api):
    runs = [RunFactory(owner=api.user, name=f"run {i}") for i in range(3)]
    RunFactory(name="someone else's")
    found = api.runs()
    assert isinstance(found, list) and all(isinstance(r, dict) for r in found)
    assert sorted(r["id"] for r in found) == sorted(r.id for r in runs)
    assert len(api.runs(limit=2)) == 2 and api.runs_count() == 3
    assert isinstance(api.run(runs[0].id), dict) and isinstance(api.base_models(), list)


def test_events_and_logs_are_lists_followed_past_one_page(api):
    run = RunFactory(owner=api.user)
    for i in range(1203):  # more than one page of the API's (1,000)
        run_event(run=run, kind="note", message=f"event {i}")
    for i in range(5):
        run_log(run_id=run.id, message=f"line {i}")
    events = api.events(run.id)
    assert isinstance(events, list) and len(events) >= 1203
    ids = [e["id"] for e in events]
    assert ids == sorted(ids)
    assert [e["message"] for e in events if e["kind"] == "note"][-1] == "event 1202"
    assert api.events(run.id, after=ids[-2]) == events[-1:]
    logs = api.logs(run.id)
    assert [line["message"] for line in logs] == [f"line {i}" for i in range(5)]
    assert api.logs(run.id, after=logs[-1]["id"]) == []
