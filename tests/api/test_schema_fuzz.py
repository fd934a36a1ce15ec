"""Property-based test of the whole API against its own OpenAPI schema (schemathesis): whatever the
generated input, valid or not, the answer is never a server error.

The Django app runs in-process over WSGI in the test's thread, so requests share the test's database
connection and transaction (and nothing is left behind). Examples per operation are bounded so the
run takes about a minute.
"""

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from tests.api.conftest import token_client  # noqa: F401  (fixtures below need the factories it imports)
from tests.factories import CheckpointFactory, RunFactory, StepFactory, TrajectoryFactory

MAX_EXAMPLES = 10


def _schema():
    from django.core.wsgi import get_wsgi_application
    from drf_spectacular.generators import SchemaGenerator

    loaded = schemathesis.openapi.from_dict(SchemaGenerator().get_schema(public=True))
    loaded.app = get_wsgi_application()
    # Token create/revoke would swap out the key the fuzzer authenticates with; they have their own tests.
    return loaded.exclude(path_regex=r"^/api/v1/tokens/(revoke/)?$")


schema = _schema()


@pytest.fixture
def fuzz_token(db, alice, api_settings):
    from rest_framework.authtoken.models import Token

    api_settings.REST_FRAMEWORK = {**api_settings.REST_FRAMEWORK,
                                   "DEFAULT_THROTTLE_RATES": {s: "100000/min" for s in
                                                              ("writes", "uploads", "runs", "tokens")}}
    # Some rows for ids the generator may hit (most ids it picks are 404s, which is a fine answer).
    run = RunFactory(owner=alice)
    StepFactory(run=run)
    TrajectoryFactory(group__run=run)
    CheckpointFactory(run=run, path="/nonexistent/checkpoint")
    # Django closes "old" connections at the end of each request; in-process that would be the test's
    # own connection in the middle of its transaction.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield Token.objects.create(user=alice).key
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.mark.timeout(600)
@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_input_makes_the_api_fail(case, fuzz_token):
    case.call_and_validate(headers={"Authorization": f"Token {fuzz_token}"}, checks=[not_a_server_error])
