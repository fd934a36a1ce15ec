"""Property-based test of the whole API against its own OpenAPI schema (schemathesis): whatever the
generated input, valid or not, the answer is never a server error.

The Django app runs in-process over WSGI in the test's thread, so requests share the test's database
connection and transaction (and nothing is left behind). One Hypothesis test draws an operation, valid
or invalid input for it, and half the time the ids of rows that exist (alice's run, trajectory,
checkpoint, script...), so the handlers' real paths run, not only their 404s. EXAMPLES bounds the run
(about a minute on two idle cores).
"""

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from artweb.testing.factories import (
    CheckpointFactory,
    RewardFunctionVersionFactory,
    RunFactory,
    StepFactory,
    TrajectoryFactory,
)

EXAMPLES = 300


def _schema():
    from django.core.wsgi import get_wsgi_application
    from drf_spectacular.generators import SchemaGenerator

    loaded = schemathesis.openapi.from_dict(SchemaGenerator().get_schema(public=True))
    loaded.app = get_wsgi_application()
    # Token create/revoke would swap out the key the fuzzer authenticates with; they have their own tests.
    return loaded.exclude(path_regex=r"^/api/v1/tokens/(revoke/)?$")


OPERATIONS = sorted((result.ok() for result in _schema().get_all_operations()), key=lambda op: op.label)


@pytest.fixture
def fuzz(db, alice, api_settings):
    from rest_framework.authtoken.models import Token

    api_settings.REST_FRAMEWORK = {
        **api_settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": dict.fromkeys(("writes", "uploads", "runs", "tokens"), "100000/min"),
    }
    run = RunFactory(owner=alice)
    StepFactory(run=run)
    trajectory = TrajectoryFactory(group__run=run)
    checkpoint = CheckpointFactory(run=run, path="/nonexistent/checkpoint")
    reward = RewardFunctionVersionFactory(asset__owner=alice)
    ids = {
        "run_id": run.id,
        "trajectory_id": trajectory.id,
        "group_id": trajectory.group_id,
        "checkpoint_id": checkpoint.id,
        "script_id": run.script_version.asset_id,
        "reward_id": reward.asset_id,
        "scenario_set_id": run.scenario_set_id,
        "number": 1,
    }
    # Django closes "old" connections at the end of each request; in-process that would be the test's
    # own connection in the middle of its transaction.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield {"headers": {"Authorization": f"Token {Token.objects.create(user=alice).key}"}, "ids": ids}
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.mark.slow
@pytest.mark.timeout(900)
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_no_input_makes_the_api_fail(data, fuzz):
    operation = data.draw(st.sampled_from(OPERATIONS), label="operation")
    mode = data.draw(st.sampled_from([GenerationMode.POSITIVE, GenerationMode.NEGATIVE]), label="mode")
    known = {p.name: fuzz["ids"][p.name] for p in operation.path_parameters if p.name in fuzz["ids"]}
    pinned = known if data.draw(st.booleans(), label="existing ids") else None
    case = data.draw(operation.as_strategy(generation_mode=mode, path_parameters=pinned), label="case")
    case.call_and_validate(headers=fuzz["headers"], checks=[not_a_server_error])
