"""RULER's judge is the run's base model, another registered model, or one of the owner's judge endpoints
(an OpenAI-compatible server elsewhere whose key is stored write-only).

The endpoint here is a server with known answers started by the test (tests.rollouts.sandbox.fake_judge):
an external judge cannot be reached from these machines, and no model gives known scores. It listens on
127.0.0.1, which the test lets the egress guard reach as the operator would with ARTWEB_EGRESS_ALLOW
(tests/egress.py). Everything else is real: the jailed sandbox, the proxy that adds the stored key, the
database.
"""

from types import SimpleNamespace

import pytest
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
from tests.egress import egress_allow
from tests.rollouts.sandbox.fake_judge import FakeJudge
from tests.training.services.test_ruler import NO_SERVER, SCORES, SCRIPT, rollouts
from training.config import run_config_parse
from training.engine.advantages import compute_advantages
from training.models import JudgeEndpoint, Trajectory
from training.services import inference, run_create
from training.services.judges import judge_endpoint_create, judge_endpoint_key, judge_endpoint_update
from training.services.steps.groups import groups_persist

pytestmark = pytest.mark.django_db
USER_KEY = "sk-user-judge-key-0042"


def _run(owner, judge: str):
    return RunFactory(
        owner=owner,
        script_version=RolloutScriptVersionFactory(asset__owner=owner, content=SCRIPT),
        reward_version=None,
        config=run_config_parse({"use_ruler": True, "group_size": 3, "ruler_judge": judge}).model_dump(),
    )


def test_an_endpoint_judge_scores_the_run_with_the_users_key_added_by_the_proxy(alice, settings):
    with FakeJudge(SCORES) as judge:
        egress_allow(settings, judge.base_url)
        judge_endpoint_create(owner=alice, name="ext", base_url=judge.base_url, model="judge-model", api_key=USER_KEY)
        run = _run(alice, "endpoint:ext")
        # The policy server is never called (the script answers itself) and holds no judge.
        policy = SimpleNamespace(
            base_url=NO_SERVER, api_key="worker-key", base_model_name=run.base_model.name, merged=False
        )
        timings = {}
        scenarios, results = rollouts(run, policy, "SmolLM2-135M-Instruct", timings)
    assert [g.rewards for g in results] == [SCORES, SCORES]
    assert [(r["body"]["model"], r["authorization"]) for r in judge.requests] == [
        ("judge-model", f"Bearer {USER_KEY}")
    ] * 2
    assert timings["ruler"] > 0
    advantages = compute_advantages([g.trajectories for g in results])
    assert advantages.values[0] == pytest.approx([-1.16248, 1.27872, -0.11625], abs=1e-4)
    type(run).objects.filter(id=run.id).update(worker="w")
    groups = groups_persist(run, 1, "train", scenarios, results, me="w")
    rows = Trajectory.objects.filter(group=groups[0]).order_by("index")
    assert [t.metadata["ruler_explanation"] for t in rows] == [f"judged {k} of 3" for k in (1, 2, 3)]
    # The key never reached user code: nothing the sandbox returned carries it.
    assert USER_KEY not in repr([g.trajectories for g in results])


def test_another_registered_model_judges_on_a_server_the_worker_starts_for_it(alice, monkeypatch):
    other = BaseModelFactory(name="Qwen-judge", source="org/qwen")
    started = []
    with FakeJudge(SCORES) as judge:

        def judge_server(base_model):
            started.append(base_model)
            return SimpleNamespace(base_url=judge.base_url, api_key="judge-server-key", base_model_name="Qwen-judge")

        monkeypatch.setattr(inference, "judge_server", judge_server)
        run = _run(alice, "model:Qwen-judge")
        policy = SimpleNamespace(
            base_url=NO_SERVER, api_key="worker-key", base_model_name=run.base_model.name, merged=False
        )
        _, results = rollouts(run, policy, "SmolLM2-135M-Instruct")
    assert started == [other]
    assert [g.rewards for g in results] == [SCORES, SCORES]
    assert {r["body"]["model"] for r in judge.requests} == {"Qwen-judge"}


def test_a_run_may_only_name_a_judge_its_owner_can_use(alice, bob):
    judge_endpoint_create(owner=bob, name="bobs", base_url="https://93.184.215.14/v1", model="m")
    kwargs = {
        "owner": alice,
        "name": "r",
        "base_model": BaseModelFactory(),
        "script_version": RolloutScriptVersionFactory(asset__owner=alice),
        "reward_version": RewardFunctionVersionFactory(asset__owner=alice),
        "scenario_set": ScenarioSetFactory(owner=alice),
        "start": False,
    }
    with pytest.raises(ApplicationError) as exc:
        run_create(config={"use_ruler": True, "ruler_judge": "endpoint:bobs"}, **kwargs)
    assert "names no judge you can use" in exc.value.message and "'model:SmolLM2-135M-Instruct'" in exc.value.message
    assert "ruler_judge" in exc.value.field_errors
    judge_endpoint_create(owner=alice, name="mine", base_url="https://93.184.215.14/v1", model="m")
    assert (
        run_create(config={"use_ruler": True, "ruler_judge": "endpoint:mine"}, **kwargs).config["ruler_judge"]
        == "endpoint:mine"
    )


@pytest.mark.parametrize(
    "url, fragment",
    [
        ("http://127.0.0.1:8100/v1", "127.0.0.1 is a loopback address"),
        ("http://localhost/v1", "localhost resolves to 127.0.0.1, which is a loopback address"),
        ("https://10.1.2.3/v1", "10.1.2.3 is a private network"),
        ("http://[::1]/v1", "::1 is a loopback address"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("https://93.184.215.14:8443/v1", "Port 8443 of 93.184.215.14 is not allowed"),
        ("ftp://example.com/v1", "base URL"),
        ("https://user:pw@93.184.215.14/v1", "may not carry"),
    ],
)
def test_an_endpoint_must_be_a_public_http_server(alice, url, fragment):
    with pytest.raises(ApplicationError) as exc:
        judge_endpoint_create(owner=alice, name="x", base_url=url, model="m")
    assert fragment in exc.value.message and "base_url" in exc.value.field_errors
    if "base URL" not in fragment and "carry" not in fragment:
        assert "ARTWEB_EGRESS_" in exc.value.message  # the setting that would allow it
    assert not JudgeEndpoint.objects.exists()


def test_a_private_judge_saved_while_allowed_is_refused_at_use_once_disallowed(alice, settings):
    allowed = settings.ARTWEB_EGRESS
    egress_allow(settings, "http://127.0.0.1:9/v1")
    judge_endpoint_create(owner=alice, name="lan", base_url="http://127.0.0.1:9/v1", model="m")
    run = _run(alice, "endpoint:lan")
    settings.ARTWEB_EGRESS = allowed
    with pytest.raises(ApplicationError, match="127.0.0.1 is a loopback address"):
        rollouts(run, SimpleNamespace(base_url=NO_SERVER, api_key="k", base_model_name="x", merged=False), "p")


def test_the_key_is_write_only_in_the_api_and_kept_when_left_out(alice, bob):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=alice).key}")
    created = api.post(
        "/api/v1/judges/create/",
        {"name": "ext", "base_url": "https://93.184.215.14/v1", "model": "judge", "api_key": USER_KEY},
        format="json",
    )
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["api_key"] == "••••0042" and body["ruler_judge"] == "endpoint:ext" and USER_KEY not in str(body)
    endpoint = JudgeEndpoint.objects.get(id=body["id"])
    assert USER_KEY not in endpoint.key_encrypted and judge_endpoint_key(endpoint) == USER_KEY

    updated = api.post(f"/api/v1/judges/{endpoint.id}/update/", {"model": "judge-2"}, format="json").json()
    assert updated["model"] == "judge-2" and updated["api_key"] == "••••0042"  # key kept
    assert api.get("/api/v1/judges/").json()[0]["name"] == "ext"

    bobs = APIClient()
    bobs.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=bob).key}")
    assert bobs.get(f"/api/v1/judges/{endpoint.id}/").status_code == 404
    assert bobs.post(f"/api/v1/judges/{endpoint.id}/delete/").status_code == 404
    dup = api.post(
        "/api/v1/judges/create/", {"name": "ext", "base_url": "https://93.184.215.14/v1", "model": "m"}, format="json"
    )
    assert dup.status_code == 400 and "already have a judge" in dup.json()["message"]
    assert api.post(f"/api/v1/judges/{endpoint.id}/delete/").json() == {"deleted": endpoint.id}
    assert not JudgeEndpoint.objects.exists()


def test_judges_are_added_and_deleted_from_the_models_page(client, alice):
    client.force_login(alice)
    response = client.post(
        reverse("judge-create"),
        {
            "judge-name": "ext",
            "judge-base_url": "https://93.184.215.14/v1",
            "judge-model": "judge",
            "judge-api_key": USER_KEY,
        },
    )
    assert response.status_code == 302
    page = client.get(reverse("model-list")).content.decode()
    assert "endpoint:ext" in page and "••••0042" in page and USER_KEY not in page
    bad = client.post(
        reverse("judge-create"), {"judge-name": "lan", "judge-base_url": "http://127.0.0.1/v1", "judge-model": "m"}
    )
    assert 'id="id_judge-name"' in bad.content.decode() and 'id="id_name"' in bad.content.decode()
    assert bad.status_code == 200 and "loopback address" in bad.content.decode()
    endpoint = JudgeEndpoint.objects.get()
    assert client.post(reverse("judge-delete", args=[endpoint.id])).status_code == 302
    assert not JudgeEndpoint.objects.exists()


def test_updating_an_endpoint_checks_the_new_url(alice):
    endpoint = judge_endpoint_create(owner=alice, name="e", base_url="https://93.184.215.14/v1", model="m")
    with pytest.raises(ApplicationError, match="192.168.0.1 is a private network"):
        judge_endpoint_update(endpoint=endpoint, base_url="http://192.168.0.1/v1")
    endpoint.refresh_from_db()
    assert endpoint.base_url == "https://93.184.215.14/v1"
