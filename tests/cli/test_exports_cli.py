"""`artweb exports ...` against a live ASGI server (uvicorn subprocess) on the test database.

The test events go to a local endpoint that records them and answers as Langfuse's ingestion API
does (a real Langfuse cannot run here), and to a port nothing listens on.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from rest_framework.authtoken.models import Token

from artweb.launcher.embedded import free_port
from artweb.testing import stack
from artweb.testing.factories import RunFactory
from tests.cli import test_cli
from tests.cli.test_cli import PASSWORD, Cli
from tests.exports.conftest import start_recording_server
from training.exports.selectors import export_target_secret
from training.models import ExportTarget

SECRET = "sk-lf-secret-9876"

# The live server's settings and alice with a password, as the other CLI tests have them.
server_env, alice_login = test_cli.server_env, test_cli.alice_login


@pytest.fixture
def egress_ports():
    """Two ports on 127.0.0.1 the server's egress guard lets through (ARTWEB_EGRESS_ALLOW, as an operator
    allows a private server): the recording endpoint's and one nothing listens on."""
    first = free_port()
    return first, next(p for p in iter(free_port, None) if p != first)


@pytest.fixture
def server(server_env, egress_ports, tmp_path):
    allowed = ",".join(f"127.0.0.1:{port}" for port in egress_ports)
    web = stack.start_web({**server_env, "ARTWEB_EGRESS_ALLOW": allowed}, tmp_path / "logs")
    yield web
    web.kill()


class ExportsCli(Cli):
    def run(self, *args: str, input: str | None = None, ok: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [sys.executable, "-m", "artweb.cli", "exports", *args],
            env=self.env(),
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=stack.REPO,
            check=False,
        )
        if ok:
            assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result


@pytest.mark.slow
def test_the_cli_creates_tests_edits_and_deletes_export_targets(server, egress_ports, alice_login, django_user_model):
    cli = ExportsCli(server.extra["url"])
    cli.token = cli("token", "create", "--username", "alice", "--password", PASSWORD).stdout.strip()
    endpoint = start_recording_server(egress_ports[0])
    try:
        out = cli.run(
            "create",
            "langfuse",
            "--set",
            f"host={endpoint.url}",
            "--set",
            "public_key=pk-lf-cli",
            "--secret-stdin",
            "--test",
            input=SECRET + "\n",
        ).stdout
        target = ExportTarget.objects.get(owner=alice_login, kind="langfuse")
        assert f"created export {target.id}: langfuse for all your runs (key ••••9876)" in out
        assert f"test event sent: Langfuse at {endpoint.url} accepted a test trace" in out
        assert export_target_secret(target) == SECRET
        (request,) = endpoint.requests
        assert request["body"]["batch"][0]["body"]["name"] == "artweb connection test"

        listed = cli.run("list").stdout
        assert "langfuse" in listed and "••••9876" in listed and "all your runs" in listed
        shown = json.loads(cli.run("show", str(target.id), "--json").stdout)
        assert shown["secret"] == "••••9876" and SECRET not in json.dumps(shown)

        # Editing one setting keeps the others and the key.
        dead = f"http://127.0.0.1:{egress_ports[1]}"
        assert "(key ••••9876)" in cli.run("edit", str(target.id), "--set", f"host={dead}").stdout
        target.refresh_from_db()
        assert target.settings["host"] == dead and target.settings["public_key"] == "pk-lf-cli"
        assert export_target_secret(target) == SECRET
        failed = cli.run("test", str(target.id), ok=False)
        assert failed.returncode == 1
        assert f"test event failed: Langfuse at {dead} is unreachable" in failed.stderr
        assert SECRET not in failed.stdout + failed.stderr

        run = RunFactory(owner=alice_login, name="cli-exports")
        out = cli.run(
            "create",
            "wandb",
            "--run",
            str(run.id),
            "--set",
            "project=my-agent",
            "--set",
            "trajectories_per_step=4",
            "--set",
            "log_checkpoints=true",
        ).stdout
        wandb_target = ExportTarget.objects.get(owner=alice_login, kind="wandb")
        assert f"wandb for run {run.id} (key none)" in out
        assert wandb_target.settings["trajectories_per_step"] == 4 and wandb_target.settings["log_checkpoints"] is True
        assert [t["kind"] for t in json.loads(cli.run("list", "--run", str(run.id), "--json").stdout)] == ["wandb"]

        bad = cli.run("create", "wandb", "--set", "project=has spaces", ok=False)
        assert bad.returncode == 1 and "Error (400)" in bad.stderr and "settings.project" in bad.stderr
        assert "use letters, digits" in bad.stderr
        assert "trajectories_per_step" in cli.run("kinds").stdout

        bob = django_user_model.objects.create_user("bob", "bob@example.com", "bob-pass-123")
        as_bob = ExportsCli(server.extra["url"])
        as_bob.token = Token.objects.create(user=bob).key
        for args in (("show", str(target.id)), ("test", str(target.id)), ("delete", str(target.id), "--yes")):
            denied = as_bob.run(*args, ok=False)
            assert denied.returncode == 1 and "Error (404)" in denied.stderr, args

        assert f"export {target.id} deleted" in cli.run("delete", str(target.id), "--yes").stdout
        assert not ExportTarget.objects.filter(id=target.id).exists()
    finally:
        endpoint.stop()
