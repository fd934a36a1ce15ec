"""Named hosts and secrets of a run: who may list hosts (ARTWEB_NAMED_HOSTS), how hosts and secret names are
checked, secrets stored write-only, and a step's batch that reaches its tool server with its secret, with
every connection in the trajectories' logs and the run's timeline.

The tool server is real (HTTPS on 127.0.0.1, tests.tls_web), allowed as an operator would with
ARTWEB_EGRESS_ALLOW; its name, search.test, is answered in this process (tests.tls_web.resolving), where
the worker's proxy resolves it, because no DNS server that answers for it can run here. Everything else
is real: the jailed sandbox, the proxy, the database.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from artweb.errors import ApplicationError
from artweb.testing.factories import (
    BaseModelFactory,
    RewardFunctionVersionFactory,
    RolloutScriptVersionFactory,
    RunFactory,
    ScenarioSetFactory,
)
from rollouts.sandbox.egress import target_key
from tests.tls_web import ToolServer, resolving, self_signed
from training.config import run_config_parse
from training.models import Run, RunEvent, Trajectory, UserSecret
from training.services import run_create
from training.services.steps import batch
from training.services.steps.groups import groups_persist
from training.services.tools import run_secrets_env, secret_set

pytestmark = pytest.mark.django_db
KEY = "sk-search-alice-000000000042"
NO_SERVER = "http://127.0.0.1:9/v1"


def _kwargs(owner):
    return {
        "owner": owner,
        "name": "r",
        "base_model": BaseModelFactory(),
        "script_version": RolloutScriptVersionFactory(asset__owner=owner),
        "reward_version": RewardFunctionVersionFactory(asset__owner=owner),
        "scenario_set": ScenarioSetFactory(owner=owner),
        "start": False,
    }


# --- the config ------------------------------------------------------------------------------------------


def test_it_keeps_hosts_as_host_and_port():
    cfg = run_config_parse({"hosts": "API.Search.example, mcp.example.com:80, [2606:4700::1111]"})
    assert cfg.hosts == ["api.search.example:443", "mcp.example.com:80", "[2606:4700::1111]:443"]


@pytest.mark.parametrize(
    "entry, fragment",
    [
        ("https://api.search.example", "without scheme, path or user"),
        ("api.search.example/v1", "without scheme, path or user"),
        ("127.0.0.1", "127.0.0.1 is a loopback address"),
        ("10.0.0.7:443", "private network"),
        ("[::1]:443", "loopback"),
        ("169.254.169.254", "link-local"),
        ("api.search.example:8443", "port 8443 of api.search.example is not allowed"),
        ("api.search.example:0", "no valid port"),
        ("bad_name!.example", "not a valid host name"),
        ("2001:db8::1", "in brackets"),
    ],
)
def test_it_refuses_each_bad_host_with_what_to_fix(entry, fragment):
    with pytest.raises(ApplicationError) as exc:
        run_config_parse({"hosts": [entry, "fine.example"]})
    assert fragment in exc.value.field_errors["hosts"][0]


def test_an_operator_allows_a_private_host_by_host_and_port(settings):
    with pytest.raises(ApplicationError, match="ARTWEB_EGRESS_ALLOW=127.0.0.1:8443"):
        run_config_parse({"hosts": ["127.0.0.1:8443"]})
    settings.ARTWEB_EGRESS = dataclasses.replace(settings.ARTWEB_EGRESS, allowed_hosts=frozenset({"127.0.0.1:8443"}))
    assert run_config_parse({"hosts": ["127.0.0.1:8443"]}).hosts == ["127.0.0.1:8443"]


@pytest.mark.parametrize("name", ["OPENAI_BASE_URL", "HTTPS_PROXY", "ARTWEB_PROXY_SOCKET", "PATH", "lower", "1X"])
def test_secret_names_are_environment_names_the_sandbox_does_not_set(name):
    with pytest.raises(ApplicationError) as exc:
        run_config_parse({"secrets": [name]})
    assert "secrets" in exc.value.field_errors


# --- who may ---------------------------------------------------------------------------------------------


def test_named_hosts_are_off_by_default_and_the_refusal_says_who_can_allow_them(alice, settings):
    assert settings.ARTWEB_NAMED_HOSTS == "off"
    with pytest.raises(ApplicationError) as exc:
        run_create(config={"hosts": ["api.search.example"]}, **_kwargs(alice))
    assert "ARTWEB_NAMED_HOSTS" in exc.value.message and "hosts" in exc.value.field_errors
    assert not Run.objects.exists()


def test_permitted_means_staff_and_those_granted_the_permission(alice, bob, staff, settings):
    settings.ARTWEB_NAMED_HOSTS = "permitted"
    config = {"hosts": ["api.search.example"]}
    with pytest.raises(ApplicationError, match="Can let runs reach named hosts"):
        run_create(config=config, **_kwargs(alice))
    alice.user_permissions.add(Permission.objects.get(codename="use_named_hosts"))
    alice = type(alice).objects.get(id=alice.id)  # permissions are cached per user object
    assert run_create(config=config, **_kwargs(alice)).config["hosts"] == ["api.search.example:443"]
    assert run_create(config=config, **_kwargs(staff)).config["hosts"] == ["api.search.example:443"]
    settings.ARTWEB_NAMED_HOSTS = "staff"
    with pytest.raises(ApplicationError, match="only staff"):
        run_create(config=config, **_kwargs(bob))
    settings.ARTWEB_NAMED_HOSTS = "all"
    assert run_create(config=config, **_kwargs(bob)).config["hosts"] == ["api.search.example:443"]


def test_the_launch_form_shows_the_refusal_under_hosts(as_user, alice):
    objs = _kwargs(alice)
    data = {
        "name": "my run",
        "base_model": objs["base_model"].id,
        "script_version": objs["script_version"].id,
        "reward_version": objs["reward_version"].id,
        "scenario_set": objs["scenario_set"].id,
        "hosts": "api.search.example",
        "train": "",
    }
    response = as_user(alice).post(reverse("run-launch"), data)
    assert response.status_code == 200 and not Run.objects.exists()
    assert any("ARTWEB_NAMED_HOSTS" in e for e in response.context["form"].errors["hosts"])


# --- secrets ---------------------------------------------------------------------------------------------


def test_a_run_names_only_its_owners_secrets_and_stores_names_only(alice, bob):
    secret_set(owner=bob, name="SEARCH_API_KEY", value="sk-bob-0000000000000000")
    with pytest.raises(ApplicationError) as exc:
        run_create(config={"secrets": ["SEARCH_API_KEY"]}, **_kwargs(alice))
    assert "no secret named SEARCH_API_KEY" in exc.value.message and "secrets" in exc.value.field_errors
    secret_set(owner=alice, name="SEARCH_API_KEY", value=KEY)
    run = run_create(config={"secrets": ["SEARCH_API_KEY"]}, **_kwargs(alice))
    assert run.config["secrets"] == ["SEARCH_API_KEY"] and KEY not in str(Run.objects.values().get(id=run.id))
    assert run_secrets_env(run=run, cfg=run_config_parse(run.config)) == {"SEARCH_API_KEY": KEY}
    UserSecret.objects.filter(owner=alice).delete()
    with pytest.raises(ApplicationError) as gone:
        run_secrets_env(run=run, cfg=run_config_parse(run.config))
    assert "SEARCH_API_KEY" in gone.value.message and KEY not in gone.value.message


def test_secrets_are_write_only_in_the_api(alice, bob):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=alice).key}")
    made = api.post("/api/v1/secrets/set/", {"name": "SEARCH_API_KEY", "value": KEY}, format="json")
    assert made.status_code == 200 and made.json()["value"] == "••••0042" and KEY not in str(made.json())
    stored = UserSecret.objects.get()
    assert KEY not in stored.value_encrypted
    again = api.post("/api/v1/secrets/set/", {"name": "SEARCH_API_KEY", "value": "short"}, format="json")
    assert again.json()["value"] == "••••" and UserSecret.objects.count() == 1  # replaced, no digits of a short one
    refused = api.post("/api/v1/secrets/set/", {"name": "OPENAI_API_KEY", "value": "x"}, format="json")
    assert refused.status_code == 400 and "set by the sandbox itself" in refused.json()["message"]
    assert [s["name"] for s in api.get("/api/v1/secrets/").json()] == ["SEARCH_API_KEY"]
    bobs = APIClient()
    bobs.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=bob).key}")
    assert bobs.get("/api/v1/secrets/").json() == []
    assert bobs.post(f"/api/v1/secrets/{stored.id}/delete/").status_code == 404
    assert api.post(f"/api/v1/secrets/{stored.id}/delete/").json() == {"deleted": stored.id}
    assert not UserSecret.objects.exists()


def test_secrets_are_kept_and_deleted_on_the_secrets_page(client, alice):
    client.force_login(alice)
    assert client.post(reverse("secret-list"), {"name": "SEARCH_API_KEY", "value": KEY}).status_code == 302
    page = client.get(reverse("secret-list")).content.decode()
    assert "SEARCH_API_KEY" in page and "••••0042" in page and KEY not in page
    assert "Named hosts are off on this artweb" in page
    bad = client.post(reverse("secret-list"), {"name": "HTTPS_PROXY", "value": KEY})
    assert bad.status_code == 200 and "set by the sandbox itself" in bad.content.decode()
    assert KEY not in bad.content.decode()  # a value entered is never rendered back
    secret = UserSecret.objects.get()
    assert client.post(reverse("secret-delete", args=[secret.id])).status_code == 302
    assert not UserSecret.objects.exists()


# --- a step's batch ----------------------------------------------------------------------------------------

SCRIPT = """
import art, os, requests

async def rollout(model, scenario):
    with open("/tmp/ca.pem", "w") as fh:
        fh.write(os.environ["TOOL_CA"])
    print(dict(os.environ))
    found = requests.get(os.environ["TOOL_URL"] + "/search?q=" + scenario.answer, verify="/tmp/ca.pem", timeout=10,
                         headers={"Authorization": "Bearer " + os.environ["SEARCH_API_KEY"]}).json()
    try:
        requests.get("https://unlisted.test/", verify="/tmp/ca.pem", timeout=10)
    except requests.exceptions.ProxyError:
        pass
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": scenario.prompt}], reward=1.0,
                          metadata={"results": found["results"]})
"""


def test_a_steps_batch_reaches_its_host_with_its_secret_and_logs_every_connection(
    alice, bob, settings, monkeypatch, tmp_path
):
    cert, key = self_signed(tmp_path)
    server = ToolServer(cert, key)
    resolving(monkeypatch, {"search.test": "127.0.0.1", "unlisted.test": "127.0.0.1"})
    host = f"search.test:{server.port}"
    settings.ARTWEB_NAMED_HOSTS = "all"
    settings.ARTWEB_EGRESS = dataclasses.replace(
        settings.ARTWEB_EGRESS, allowed_hosts=frozenset({target_key("search.test", server.port)})
    )
    secret_set(owner=alice, name="SEARCH_API_KEY", value=KEY)
    secret_set(owner=alice, name="TOOL_URL", value=f"https://{host}")
    secret_set(owner=alice, name="TOOL_CA", value=cert.read_text())
    secret_set(owner=bob, name="BOB_API_KEY", value="sk-bob-999999999999")
    config = {"hosts": [host], "secrets": ["SEARCH_API_KEY", "TOOL_URL", "TOOL_CA"], "group_size": 2}
    run = RunFactory(
        owner=alice,
        script_version=RolloutScriptVersionFactory(asset__owner=alice, content=SCRIPT),
        config=run_config_parse(config).model_dump(),
    )
    cfg = run_config_parse(run.config)
    scenarios = list(run.scenario_set.scenarios.filter(split="train").order_by("index")[:1])
    policy = SimpleNamespace(base_url=NO_SERVER, api_key="k", base_model_name=run.base_model.name, merged=False)
    try:
        results = batch.rollouts_run(
            run, cfg, scenarios, "policy", policy, SimpleNamespace(should_stop=lambda: False), cfg.group_size
        )
    finally:
        server.close()
    assert [t["error"] for t in results[0].trajectories] == [None, None]
    assert [auth for _, auth in server.requests] == [f"Bearer {KEY}"] * 2
    Run.objects.filter(id=run.id).update(worker="w")
    groups_persist(run, 1, "train", scenarios, results, me="w")
    stored = str(list(Trajectory.objects.filter(run=run).values()))
    assert "SEARCH_API_KEY" in stored and KEY not in stored and "sk-bob" not in stored and "BOB_API_KEY" not in stored
    logs = Trajectory.objects.filter(run=run).first().logs
    assert sum(f"{host}: connected" in line for line in logs) == 2
    assert sum("unlisted.test:443: refused" in line and "not one of this run's hosts" in line for line in logs) == 2
    event = RunEvent.objects.get(run=run, kind="egress")
    assert event.data["connections"] == 2 and event.data["refused"] == 2 and event.data["level"] == "warning"
    assert event.data["hosts"][host]["received"] > 0 and event.data["hosts"][host]["sent"] > 0
    assert event.message.startswith("Step 1: 2 tunnel connection(s)") and "unlisted.test:443" in event.message
    assert KEY not in str(RunEvent.objects.filter(run=run).values())
