"""A user's target never uses the operator's credentials or servers from the worker's environment
(WANDB_API_KEY, WANDB_BASE_URL, LANGFUSE_*): it would export into the operator's account, send the
operator's key to a server of the user's choosing, or hand it to the user's rollout script.
A staff member's (the operator's own) target still may, which the controls here show is detectable.

The W&B cases run the real wandb client against local recording endpoints; each starts from a fresh
wandb session, because wandb reads the environment once per session.
"""

import base64

import pytest

from artweb.testing.factories import RunFactory
from tests.egress import egress_allow
from tests.exports.conftest import start_recording_server
from training.exports.base import ExportError
from training.exports.langfuse import DEFAULT_HOST, langfuse_endpoint
from training.exports.schemas import export_settings_parse
from training.exports.services import export_sync, export_target_create, export_target_test
from training.exports.weave import export_rollout_env

# W&B checks a key's form (40 characters or more) before sending it anywhere.
OPERATOR_KEY = "operatorkey" + "o" * 29
USER_KEY = "alicekey" + "a" * 32


def basic_keys(recorder) -> set[str]:
    """The keys of the Basic credentials the endpoint received (wandb sends "api:<key>")."""
    out = set()
    for r in recorder.requests:
        auth = r["headers"].get("Authorization", "")
        if auth.startswith("Basic "):
            out.add(base64.b64decode(auth[6:]).decode().split(":", 1)[1])
    return out


@pytest.fixture
def fresh_wandb(monkeypatch, tmp_path):
    import wandb

    import training.exports.wandb as wandb_export

    monkeypatch.setattr(wandb_export, "INIT_TIMEOUT_S", 3.0)
    monkeypatch.setattr(wandb_export, "TEST_INIT_TIMEOUT_S", 3.0)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no netrc login of this machine's
    wandb.teardown()
    yield
    wandb.teardown()


@pytest.fixture
def operator_env(monkeypatch, recording_server):
    """The worker's environment holds the operator's W&B key and server (a recording endpoint)."""
    monkeypatch.setenv("WANDB_API_KEY", OPERATOR_KEY)
    monkeypatch.setenv("WANDB_BASE_URL", recording_server.url)
    return recording_server


def test_it_does_not_use_the_operators_wandb_key_for_a_users_target(run_with_steps, fresh_wandb, operator_env):
    target = export_target_create(owner=run_with_steps.owner, kind="wandb", settings={"project": "p"})
    with pytest.raises(ExportError, match="W&B needs an API key: enter yours"):
        export_sync(target_id=target.id, run_id=run_with_steps.id)
    result = export_target_test(target=target, actor=run_with_steps.owner)
    assert not result.ok and "needs an API key" in result.message and "WANDB_API_KEY" not in result.message
    assert operator_env.requests == []  # nothing went anywhere, least of all with the operator's key


def test_it_sends_a_users_key_to_the_users_server_only(
    run_with_steps, fresh_wandb, operator_env, recording_server, settings
):
    """The operator's WANDB_BASE_URL (one endpoint) is ignored; the user's base_url (another) is used,
    with the user's key."""
    users_server = start_recording_server()
    egress_allow(settings, users_server.url)
    try:
        target = export_target_create(
            owner=run_with_steps.owner,
            kind="wandb",
            secret=USER_KEY,
            settings={"project": "p", "base_url": users_server.url},
        )
        result = export_target_test(target=target, actor=run_with_steps.owner)
        assert not result.ok  # a recording endpoint is no W&B server
        assert basic_keys(users_server) == {USER_KEY}
        assert operator_env.requests == []
        assert USER_KEY not in result.message
    finally:
        users_server.stop()


def test_without_a_base_url_a_users_target_goes_to_wandbs_own_server(alice, monkeypatch, recording_server):
    """Not to WANDB_BASE_URL: the settings handed to wandb name the server, and settings win over the
    environment in wandb. Checked on the settings, so no request leaves this machine."""
    import wandb

    from training.exports.wandb import wandb_settings

    monkeypatch.setenv("WANDB_BASE_URL", recording_server.url)
    monkeypatch.setenv("WANDB_API_KEY", OPERATOR_KEY)
    cfg = export_settings_parse("wandb", {"project": "p"})
    users = wandb_settings(cfg, USER_KEY, worker_env=False, init_timeout=3)
    assert users["api_key"] == USER_KEY
    assert users["base_url"] == wandb.Settings.model_fields["base_url"].default != recording_server.url
    operators = wandb_settings(cfg, OPERATOR_KEY, worker_env=True, init_timeout=3)
    assert "base_url" not in operators  # wandb takes WANDB_BASE_URL itself


def test_the_operators_own_target_does_use_the_environment(staff, fresh_wandb, operator_env):
    """The control: with the same environment, a staff target's attempt reaches the operator's server
    with the operator's key, so the tests above would see a leak."""
    target = export_target_create(owner=staff, kind="wandb", settings={"project": "p"})
    result = export_target_test(target=target, actor=staff)
    assert not result.ok
    assert basic_keys(operator_env) == {OPERATOR_KEY}
    assert OPERATOR_KEY not in result.message


def test_it_does_not_use_the_operators_langfuse_keys_or_host(run_with_steps, monkeypatch, recording_server, staff):
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk-operator")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-operator")
    monkeypatch.setenv("LANGFUSE_HOST", recording_server.url)
    target = export_target_create(owner=run_with_steps.owner, kind="langfuse")
    with pytest.raises(ExportError, match="missing: public key, secret key"):
        export_sync(target_id=target.id, run_id=run_with_steps.id)
    assert not export_target_test(target=target, actor=run_with_steps.owner).ok
    assert recording_server.requests == []

    cfg = export_settings_parse("langfuse", {"public_key": "pk-alice"})
    assert langfuse_endpoint(cfg, "sk-alice", worker_env=False) == (DEFAULT_HOST, "pk-alice", "sk-alice")
    assert langfuse_endpoint(export_settings_parse("langfuse", {}), "sk-operator", worker_env=True) == (
        recording_server.url,
        "pk-operator",
        "sk-operator",
    )


def test_it_hands_a_users_rollouts_no_key_or_server_of_the_operators(alice, staff, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", OPERATOR_KEY)
    monkeypatch.setenv("WANDB_BASE_URL", "http://wandb.operator.internal")
    monkeypatch.setenv("WF_TRACE_SERVER_URL", "http://traces.operator.internal")
    run = RunFactory(owner=alice)
    target = export_target_create(owner=alice, kind="weave", settings={"project": "team/agents"})
    assert export_rollout_env(run=run) == {}  # untraced rather than traced with the operator's key
    export_target_create(owner=alice, kind="weave", settings={"project": "team/agents"}, secret=USER_KEY, run=run)
    assert export_rollout_env(run=run) == {"WEAVE_PROJECT": "team/agents", "WANDB_API_KEY": USER_KEY}
    result = export_target_test(target=target, actor=alice)
    assert not result.ok and "Weave needs a W&B API key" in result.message

    staff_run = RunFactory(owner=staff)
    export_target_create(owner=staff, kind="weave", settings={"project": "ops/agents"})
    assert export_rollout_env(run=staff_run) == {
        "WEAVE_PROJECT": "ops/agents",
        "WANDB_API_KEY": OPERATOR_KEY,
        "WANDB_BASE_URL": "http://wandb.operator.internal",
        "WF_TRACE_SERVER_URL": "http://traces.operator.internal",
    }
