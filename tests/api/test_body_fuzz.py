"""Malformed bodies to every API route: nested 50,000 deep, over the size limit, not UTF-8, and JSON of the
wrong type (array, string, number, null), each with every method the route allows, from a signed-in
non-staff user with a token and with a session. No answer is a server error, and each refusal is the
one a person can act on: a 400 naming the depth limit, a 413 for the size, a 400 for the encoding.

The routes come from the URL resolver itself, so a route added later is fuzzed without editing this
file. Path ids name alice's own rows where she has one of that kind, so handlers run past their 404s.
"""

from __future__ import annotations

import pytest
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from artweb.api import MIB
from artweb.testing.client_factories import ClientRunFactory
from artweb.testing.factories import (
    CheckpointFactory,
    RewardFunctionVersionFactory,
    RunFactory,
    StepFactory,
    TrajectoryFactory,
)
from rollouts.models import DataAttachment
from tests.api.conftest import token_client
from training.models import DryRun, ExportTarget, JudgeEndpoint, Rescore, UserSecret
from training.serving.models import ServeJob

DEPTH = 50_000
BODIES = {
    "nested": b"[" * DEPTH + b"]" * DEPTH,
    "nested-object": b'{"a":' * DEPTH + b"1" + b"}" * DEPTH,
    # Over every JSON body limit of the API (1 MiB, uploads 4 MiB).
    "huge": b'["' + b"x" * (4 * MIB + 1024) + b'"]',
    "invalid-utf8": b'{"name": "\xff\xfe"}',
    "array": b"[1, 2, 3]",
    "string": b'"text"',
    "number": b"42",
    "null": b"null",
}
BODY_METHODS = {"post", "put", "patch", "delete"}
ALLOWED = {200, 201, 202, 204, 400, 401, 403, 404, 405, 409, 413, 415, 429}


def _routes(resolver=None, prefix: str = ""):
    """(route pattern, callback) for every URL under /api/v1/."""
    for pattern in (resolver or get_resolver()).url_patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern, route)
        elif isinstance(pattern, URLPattern) and route.startswith("api/v1/"):
            yield route, pattern.callback


def _methods(callback) -> list[str]:
    view_class = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if view_class is None:  # a function view: it says itself which methods it takes
        return sorted(BODY_METHODS | {"get"})
    return sorted(m for m in view_class.http_method_names if m not in ("options", "head") and hasattr(view_class, m))


ROUTES = sorted((route, method) for route, callback in _routes() for method in _methods(callback))


@pytest.fixture
def world(db, alice, api_settings):
    """alice's rows of every kind a route names, and throttles out of the way (their own tests exist)."""
    api_settings.REST_FRAMEWORK = {
        **api_settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": dict.fromkeys(("writes", "uploads", "runs", "tokens", "endpoint"), "1000000/min"),
    }
    run = RunFactory(owner=alice)
    StepFactory(run=run)
    trajectory = TrajectoryFactory(group__run=run)
    reward = RewardFunctionVersionFactory(asset__owner=alice)
    ids = {
        "run_id": run.id,
        "trajectory_id": trajectory.id,
        "group_id": trajectory.group_id,
        "checkpoint_id": CheckpointFactory(run=run, path="/nonexistent/checkpoint").id,
        "script_id": run.script_version.asset_id,
        "reward_id": reward.asset_id,
        "scenario_set_id": run.scenario_set_id,
        "number": 1,
        "dry_run_id": DryRun.objects.create(
            owner=alice, script_version=run.script_version, base_model=run.base_model, scenarios=[]
        ).id,
        "rescore_id": Rescore.objects.create(owner=alice, run=run, reward_version=reward).id,
        # A serve job's id: on the ART routes (training.client_runs) it names no training job of hers: a 404.
        "job_id": ServeJob.objects.create(owner=alice, kind=ServeJob.Kind.DIFF).id,
        "model_id": ClientRunFactory(owner=alice).id,  # an ART client's model: its run's id
        "endpoint_id": JudgeEndpoint.objects.create(
            owner=alice, name="judge", base_url="https://judge.example.com/v1", model="m"
        ).id,
        "target_id": ExportTarget.objects.create(owner=alice, kind="wandb", settings={"project": "p"}).id,
        "secret_id": UserSecret.objects.create(owner=alice, name="FUZZ_KEY", value_encrypted="x").id,
        # A row only: the routes that read its file answer for a missing one (its own tests store files).
        "attachment_id": DataAttachment.objects.create(owner=alice, name="fuzz.db", sha256="0" * 64, size=1).id,
    }
    session = APIClient()
    session.force_login(alice)
    # Django closes "old" connections at the end of each request; in-process that would be the test's own.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield {"ids": ids, "clients": {"token": token_client(alice), "session": session}}
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def _path(route: str, ids: dict) -> str:
    import re

    def fill(match):
        name = match.group(1).split(":")[-1]
        assert name in ids, f"no row for the path parameter {name!r}: add one to the world fixture"
        return str(ids[name])

    return "/" + re.sub(r"<([^>]+)>", fill, route)


def _message(response) -> str:
    """The error's message: artweb's error shape, or the OpenAI one of /api/v1/openai/."""
    if response.streaming or "json" not in response.get("Content-Type", ""):
        return ""  # a download or an event stream: an answer, not an error
    body = response.json()
    if not isinstance(body, dict):
        return ""
    error = body.get("error")
    return body.get("message") or (error.get("message", "") if isinstance(error, dict) else "")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_no_malformed_body_makes_any_route_fail(world):
    assert len(ROUTES) > 60  # the resolver walk found the API
    answered: dict[str, list[tuple[str, str, str, int]]] = {kind: [] for kind in BODIES}
    for route, method in ROUTES:
        path = _path(route, world["ids"])
        for auth, client in world["clients"].items():
            for kind, body in BODIES.items():
                response = client.generic(method.upper(), path, data=body, content_type="application/json")
                where = f"{method.upper()} {path} ({auth}, {kind} body)"
                assert response.status_code in ALLOWED, (where, response.status_code, _message(response))
                answered[kind].append((where, method, _message(response), response.status_code))

    for kind in ("nested", "nested-object"):
        for where, _method, message, status in answered[kind]:
            if "could not be read" in message or "not JSON" in message:  # the route read the body
                assert status == 400 and "nesting depth limit is 64" in message, (where, status, message)
        refused = [w for w, _, m, s in answered[kind] if s == 400 and "nesting depth limit is 64" in m]
        assert len(refused) >= 30, refused  # the body-taking routes read it and refused it by its depth
    for where, _method, message, status in answered["huge"]:
        if "could not be read" in message or "larger than" in message:  # the route read the body
            assert status == 413 and "larger than" in message, (where, status, message)
    assert sum(s == 413 for *_, s in answered["huge"]) >= 30
    for where, _method, message, status in answered["invalid-utf8"]:
        if "could not be read" in message:
            assert status == 400 and "not UTF-8" in message, (where, status, message)
    assert sum(s == 400 and "not UTF-8" in m for *_, m, s in answered["invalid-utf8"]) >= 30
    for kind in ("array", "string", "number", "null"):  # JSON, but not the object every route takes
        assert sum(s == 400 for *_, s in answered[kind]) >= 30, kind


@pytest.mark.parametrize("auth", ["token", "session"])
def test_a_deeply_nested_body_to_validate_is_a_400_naming_the_depth_limit(world, auth):
    response = world["clients"][auth].post(
        "/api/v1/scripts/validate/", data=BODIES["nested"], content_type="application/json"
    )
    assert response.status_code == 400
    body = response.json()
    assert "nested more than 64 levels deep" in body["message"] and "nesting depth limit is 64" in body["message"]
    assert set(body) == {"message", "field_errors"}


def test_a_huge_body_is_a_413_naming_the_size_limit(world):
    response = world["clients"]["token"].post(
        "/api/v1/scripts/validate/", data=BODIES["huge"], content_type="application/json"
    )
    assert response.status_code == 413
    assert "larger than 4194304 bytes" in response.json()["message"]
