"""`artweb quota` against a live ASGI server on the test database (test_cli's server)."""

from __future__ import annotations

import json

from artweb.testing.factories import RunFactory
from tests.cli import test_cli
from tests.cli.test_cli import PASSWORD, Cli
from training.models import Quota, Run

server_env, server, alice_login = test_cli.server_env, test_cli.server, test_cli.alice_login  # its fixtures


def test_it_prints_your_usage_against_each_limit(server, alice_login):
    RunFactory(owner=alice_login, status=Run.Status.RUNNING, trajectory_bytes=3 << 20)
    Quota.objects.create(user=alice_login, concurrent_runs=1, note="pilot")
    cli = Cli(server.extra["url"])
    cli.token = cli("token", "create", "--username", "alice", "--password", PASSWORD).stdout.strip()

    table = cli("quota").stdout
    assert "Stored trajectories" in table and "3.0 MB" in table and "10,240.0 MB" in table
    assert "1 (reached)" in table and "your own quota" in table
    lines = json.loads(cli("quota", "--json").stdout)
    assert [(q["key"], q["used"], q["limit"]) for q in lines] == [
        ("trajectory_bytes", 3 << 20, 10240 << 20),
        ("concurrent_runs", 1, 1),
        ("steps_per_day", 0, 5000),
        ("gpu_seconds", 0, None),
        ("attachment_bytes", 0, 10240 << 20),
    ]
