"""Every page renders for its owner, and nobody sees anybody else's objects through any page."""

import gzip
from html.parser import HTMLParser

import pytest
from django.urls import reverse

from artweb.testing.factories import (
    BaseModelFactory,
    RewardFunctionVersionFactory,
    RolloutScriptVersionFactory,
    RunFactory,
    ScenarioSetFactory,
)
from training.models import DryRun


def _owned_urls(objs, dry_run=None) -> list[str]:
    run, traj = objs["run"], objs["traj"]
    urls = [
        reverse("run-detail", args=[run.id]),
        reverse("run-trajectories", args=[run.id]),
        reverse("run-trajectories", args=[run.id]) + f"?step=2&traj={traj.id}",
        reverse("script-detail", args=[run.script_version.asset_id]),
        reverse("reward-detail", args=[run.reward_version.asset_id]),
        reverse("scenario-set-detail", args=[run.scenario_set_id]),
    ]
    if dry_run:
        urls += [reverse("dry-run-detail", args=[dry_run.id]), reverse("dry-run-status", args=[dry_run.id])]
    return urls


def _dry_run(owner, run):
    return DryRun.objects.create(
        owner=owner,
        script_version=run.script_version,
        base_model=run.base_model,
        scenarios=[{"prompt": "p"}],
        status="done",
        result={
            "trajectories": [
                {"messages": [{"role": "user", "content": "dry hello"}], "reward": 0.5, "logs": ["log line"]}
            ]
        },
    )


def test_it_sends_anonymous_visitors_to_sign_in(client, db):
    response = client.get(reverse("run-list"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))
    page = client.get(reverse("login"))
    assert page.status_code == 200
    assert b'name="password"' in page.content


def test_it_signs_in_with_the_login_form(client, alice):
    response = client.post(reverse("login"), {"username": "alice", "password": "alice-pass-123"})
    assert response.status_code == 302
    assert client.get(reverse("run-list")).status_code == 200


def test_it_renders_every_page_for_its_owner(as_user, alice, world):
    client = as_user(alice)
    mine = world["alice"]
    dry_run = _dry_run(alice, mine["run"])
    pages = [
        reverse("run-list"),
        reverse("run-launch"),
        reverse("run-compare") + f"?runs={mine['run'].id}",
        reverse("model-list"),
        reverse("script-list"),
        reverse("script-new"),
        reverse("reward-list"),
        reverse("reward-new"),
        reverse("scenario-set-list"),
        reverse("scenario-set-new"),
        *_owned_urls(mine, dry_run),
    ]
    for url in pages:
        response = client.get(url)
        assert response.status_code == 200, url


def test_it_returns_404_for_every_page_of_another_users_objects(as_user, alice, world):
    client = as_user(alice)
    theirs = world["bob"]
    dry_run = _dry_run(theirs["run"].owner, theirs["run"])
    run = theirs["run"]
    for url in _owned_urls(theirs, dry_run):
        assert client.get(url).status_code == 404, url
    assert client.get(reverse("checkpoint-download", args=[run.id, theirs["checkpoint"].id])).status_code == 404
    # Even a checkpoint of bob's addressed through alice's own run.
    assert (
        client.get(reverse("checkpoint-download", args=[world["alice"]["run"].id, theirs["checkpoint"].id])).status_code
        == 404
    )
    # A trajectory of bob's opened inside alice's run.
    url = reverse("run-trajectories", args=[world["alice"]["run"].id]) + f"?traj={theirs['traj'].id}"
    assert client.get(url).status_code == 404
    for action in ("cancel", "pause", "resume", "retry"):
        assert client.post(reverse("run-action", args=[run.id, action])).status_code == 404
    run.refresh_from_db()
    assert run.status == "queued"


def test_it_lists_only_the_users_own_objects(as_user, alice, world):
    client = as_user(alice)
    bob_run = world["bob"]["run"]
    checks = {
        reverse("run-list"): bob_run.name,
        reverse("script-list"): bob_run.script_version.asset.name,
        reverse("reward-list"): bob_run.reward_version.asset.name,
        reverse("scenario-set-list"): bob_run.scenario_set.name,
        reverse("run-launch"): bob_run.script_version.asset.name,
        reverse("run-compare") + f"?runs={bob_run.id}&runs={world['alice']['run'].id}": bob_run.name,
    }
    for url, secret in checks.items():
        body = client.get(url).content.decode()
        assert secret not in body, url
    assert world["alice"]["run"].name in client.get(reverse("run-list")).content.decode()


def test_it_shows_staff_everything(as_user, staff, world):
    client = as_user(staff)
    body = client.get(reverse("run-list")).content.decode()
    assert "alice-run" in body and "bob-run" in body
    for objs in world.values():
        for url in _owned_urls(objs):
            assert client.get(url).status_code == 200, url


def test_it_filters_sorts_and_paginates_the_runs_list(as_user, alice, world):
    client = as_user(alice)
    RunFactory(owner=alice, name="zebra-sweep", tags=["sweep"], status="failed")
    body = client.get(reverse("run-list"), {"tag": "sweep"}).content.decode()
    assert "zebra-sweep" in body and "alice-run" not in body
    body = client.get(reverse("run-list"), {"status": "failed"}).content.decode()
    assert "zebra-sweep" in body and "alice-run" not in body
    body = client.get(reverse("run-list"), {"q": "zebra"}).content.decode()
    assert "zebra-sweep" in body and "alice-run" not in body
    body = client.get(reverse("run-list"), {"order": "name"}).content.decode()
    assert body.index("alice-run") < body.index("zebra-sweep")
    for i in range(30):
        RunFactory(
            owner=alice,
            name=f"bulk-{i:02d}",
            script_version=world["alice"]["run"].script_version,
            scenario_set=world["alice"]["run"].scenario_set,
        )
    body = client.get(reverse("run-list"), {"per_page": 25, "order": "name"}).content.decode()
    assert "Page 1 of 2" in body and "zebra-sweep" not in body


def test_it_embeds_downsampled_chart_data_in_the_run_page(as_user, alice, django_assert_max_num_queries):
    from training.models import Step

    client = as_user(alice)
    run = RunFactory(owner=alice, num_steps=2000)
    Step.objects.bulk_create(
        [
            Step(
                run=run,
                step=i,
                reward_mean=(9.0 if i == 1234 else 0.5),
                reward_std=0.1,
                metrics={"loss": 0.1, "kl": 0.01},
            )
            for i in range(1, 2001)
        ]
    )
    with django_assert_max_num_queries(20):  # 5 of them: its place in the fair queue (it is queued)
        response = client.get(reverse("run-detail", args=[run.id]))
    data = response.context["page_data"]
    assert len(data["series"]["reward_mean"]["x"]) <= 500
    assert 9.0 in data["series"]["reward_mean"]["y"]  # the spike survives downsampling
    assert len(data["series"]["reward_band"]["std"]) == len(data["series"]["reward_mean"]["x"])
    assert data["last_step"] == 2000
    assert data["ws_path"] == f"/ws/runs/{run.id}/"
    assert b'id="run-data"' in response.content
    assert len(response.content) < 500_000


def test_it_renders_a_run_without_steps_or_trajectories(as_user, alice):
    run = RunFactory(owner=alice)
    client = as_user(alice)
    response = client.get(reverse("run-detail", args=[run.id]))
    assert response.status_code == 200
    assert response.context["page_data"]["series"]["reward_mean"] == {"x": [], "y": []}
    assert response.context["page_data"]["last_step"] is None
    assert b"No trajectories yet" in client.get(reverse("run-trajectories", args=[run.id])).content


def test_it_shows_a_trajectory_as_a_transcript(as_user, alice, world):
    client = as_user(alice)
    traj = world["alice"]["traj"]
    url = reverse("run-trajectories", args=[traj.run_id]) + f"?step=2&traj={traj.id}"
    body = client.get(url).content.decode()
    assert "Question for alice" in body
    assert "lookup" in body and "&quot;q&quot;: &quot;x&quot;" in body  # tool call, arguments pretty-printed
    assert "result-text" in body
    assert "3 tokens" in body


def test_it_filters_trajectories_by_reward_and_text(as_user, alice, world):
    client = as_user(alice)
    run = world["alice"]["run"]
    url = reverse("run-trajectories", args=[run.id])
    response = client.get(url, {"step": 2, "min_reward": 0.9})
    assert [len(g["trajectories"]) for g in response.context["groups"]] == [0]
    response = client.get(url, {"step": 2, "q": "final"})
    assert [len(g["trajectories"]) for g in response.context["groups"]] == [1]
    response = client.get(url, {"all_steps": "on", "q": "final"})
    assert len(response.context["flat"]) == 1


def test_it_compares_runs_showing_only_differing_settings(as_user, alice, world):
    client = as_user(alice)
    base = world["alice"]["run"]
    other = RunFactory(
        owner=alice,
        script_version=base.script_version,
        reward_version=base.reward_version,
        scenario_set=base.scenario_set,
        config={"group_size": 8, "seed": 0},
        name="other",
    )
    base.config = {"group_size": 6, "seed": 0}
    base.save()
    response = client.get(reverse("run-compare"), {"runs": [base.id, other.id]})
    keys = [row["key"] for row in response.context["differences"]]
    assert keys == ["group_size"]
    data = response.context["chart_data"]
    assert [r["id"] for r in data["runs"]] == sorted([base.id, other.id])


def test_it_serves_plotly_from_the_package_with_long_caching(client, db):
    import plotly

    url = reverse("plotly-js", args=[plotly.__version__])
    response = client.get(url, HTTP_ACCEPT_ENCODING="gzip")
    assert response.status_code == 200
    assert "immutable" in response["Cache-Control"]
    assert response["Content-Encoding"] == "gzip"
    assert b"plotly" in gzip.decompress(response.content)[:5000].lower()
    assert client.get(reverse("plotly-js", args=["0.0.0"])).status_code == 404


def test_it_downloads_a_checkpoint_archive(as_user, alice, tmp_path, settings):
    from artweb.testing.factories import CheckpointFactory

    settings.DATA_DIR = tmp_path
    adapter = tmp_path / "ckpt"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    run = RunFactory(owner=alice)
    checkpoint = CheckpointFactory(run=run, step=1, path=str(adapter))
    response = as_user(alice).get(reverse("checkpoint-download", args=[run.id, checkpoint.id]))
    assert response.status_code == 200
    assert "attachment" in response["Content-Disposition"]
    assert b"".join(response.streaming_content)[:2] == b"\x1f\x8b"


@pytest.mark.parametrize("who", ["alice", "staff"])
def test_it_offers_shared_and_own_models(as_user, request, who, bob):
    user = request.getfixturevalue(who)
    BaseModelFactory(name="shared-model")
    BaseModelFactory(name="bobs-model", owner=bob)
    body = as_user(user).get(reverse("model-list")).content.decode()
    assert "shared-model" in body
    assert ("bobs-model" in body) is (who == "staff")


class _Outline(HTMLParser):
    """Each element of a page with the tags it sits in: (tag, attributes, enclosing tags), and its text."""

    VOID = {"meta", "link", "input", "br", "img", "hr", "source", "col", "area", "base", "wbr"}

    def __init__(self, html: str):
        super().__init__()
        self.open: list[tuple[str, dict]] = []
        self.elements: list[tuple[str, dict, tuple[str, ...], list[str]]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        element = (tag, dict(attrs), tuple(t for t, _ in self.open), [])
        self.elements.append(element)
        if tag not in self.VOID:
            self.open.append((tag, element))

    def handle_endtag(self, tag):
        while self.open and self.open.pop()[0] != tag:
            pass

    def handle_data(self, data):
        for _, element in self.open:
            element[3].append(data)

    def find(self, tag: str, **attrs) -> list[tuple[str, dict, tuple[str, ...], str]]:
        return [
            (t, a, inside, "".join(text).strip())
            for t, a, inside, text in self.elements
            if t == tag and all(a.get(k) == v for k, v in attrs.items())
        ]


def test_the_models_page_has_its_title_a_heading_the_models_table_and_the_judges_panel(as_user, alice):
    BaseModelFactory(name="shared-model")
    response = as_user(alice).get(reverse("model-list"))
    assert response.status_code == 200
    page = _Outline(response.content.decode())

    [(_, _, inside, title)] = page.find("title")
    assert title == "Models · artweb" and "body" not in inside
    [(_, _, inside, heading)] = page.find("h1")
    assert heading == "Model registry" and "main" in inside
    tables = [text for _, _, inside, text in page.find("table") if "main" in inside]
    assert any("Name" in text and "Source" in text and "shared-model" in text for text in tables)
    # The judges panel: once, inside the main content, with its table and the form that adds one.
    [(_, _, inside, judges)] = page.find("h2", id="judges")
    assert judges == "RULER judges" and "main" in inside and "head" not in inside
    assert any("main" in inside for _, _, inside, _ in page.find("form", action=reverse("judge-create")))


def test_the_launch_form_offers_only_the_users_uploads(as_user, alice, bob):
    mine = RolloutScriptVersionFactory(asset__owner=alice, asset__name="mine-script")
    RolloutScriptVersionFactory(asset__owner=bob, asset__name="bobs-script")
    RewardFunctionVersionFactory(asset__owner=bob, asset__name="bobs-reward")
    ScenarioSetFactory(owner=bob, name="bobs-set")
    body = as_user(alice).get(reverse("run-launch")).content.decode()
    assert mine.asset.name in body
    assert "bobs-script" not in body and "bobs-reward" not in body and "bobs-set" not in body


def test_the_script_and_scenario_set_pages_carry_trainings_dry_run_form(as_user, alice, world):
    """rollouts renders the panels training registers for its pages (artweb.pages): the dry-run form,
    prefilled with the newest version of the script, or with the scenario set."""
    import re

    run = world["alice"]["run"]
    client = as_user(alice)
    pages = {
        reverse("script-detail", args=[run.script_version.asset_id]): ("script_version", run.script_version_id),
        reverse("scenario-set-detail", args=[run.scenario_set_id]): ("scenario_set", run.scenario_set_id),
    }
    for url, (field, value) in pages.items():
        body = client.get(url).content.decode()
        form = re.search(rf'<form method="post" action="{reverse("dry-run-new")}".*?</form>', body, re.S)
        assert form, url
        select = re.search(rf'<select name="{field}".*?</select>', form.group(0), re.S).group(0)
        assert re.search(rf'<option value="{value}" selected>', select), url
        assert re.search(r'<select name="base_model"[^>]*>\s*<option value="\d+"', form.group(0)), url
