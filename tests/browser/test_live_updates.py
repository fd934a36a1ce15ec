"""Live groups on the run page and live rows on the runs list, in a real browser against the ASGI server.

No worker runs here: the test calls the services a worker and the launch form call (the step's
groups_persist and advantages_store, run_create, run_transition), in a thread of their own as a
worker would. Their messages leave on commit through the real Redis channel layer and consumers, and
the pages' own scripts draw them.
"""

from types import SimpleNamespace

import pytest

from artweb.testing.factories import (
    BaseModelFactory,
    RolloutScriptVersionFactory,
    RunFactory,
    ScenarioSetFactory,
    StepFactory,
)
from tests.browser.conftest import shot
from tests.browser.test_dashboard import as_worker, assert_no_console_errors
from training.services import run_create, run_transition
from training.services.steps.groups import advantages_store, groups_persist

pytestmark = pytest.mark.timeout(120)


def _traj(answer: str, reward: float) -> dict:
    return {
        "messages": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": answer}],
        "reward": reward,
        "completion_tokens": 3,
    }


def test_it_shows_each_scored_group_while_the_step_trains(signed_in, user):
    page = signed_in
    run = RunFactory(owner=user, name="grouped", num_steps=10, status="running", steps_done=1, worker="worker-1")
    StepFactory(run=run, step=1)
    page.goto(f"/runs/{run.id}/")
    page.wait_for_function("window.__artwebLive && window.__artwebLive.state === 'open'")
    assert page.inner_text("#groups-live") == "No groups scored yet."

    scenarios = list(run.scenario_set.scenarios.filter(split="train").order_by("index")[:2])
    results = [
        SimpleNamespace(trajectories=[_traj("crimson red", 1.0), _traj("a dull grey", 0.0), _traj("pale red", 0.5)]),
        SimpleNamespace(trajectories=[_traj("blue", 0.0), _traj("navy", 1.0)]),
    ]
    groups = as_worker(groups_persist, run, 2, "train", scenarios, results, me="worker-1")

    # Step 2 is still training: rewards and answers now, advantages pending.
    newest = page.locator(f"#groups-live [data-group='{groups[1].id}']")
    newest.wait_for()
    card = page.locator(f"#groups-live [data-group='{groups[0].id}']")
    card.wait_for()
    assert page.locator("#groups-live > li").first.get_attribute("data-group") == str(groups[1].id)
    assert "Step 2 · train" in card.inner_text() and "training…" in card.inner_text()
    assert card.locator("tbody tr").first.inner_text().split() == ["reward", "1.00", "0.00", "0.50"]
    assert card.locator("[data-answer=best] .quote").inner_text() == "crimson red"
    assert card.locator("[data-answer=worst] .quote").inner_text() == "a dull grey"
    assert card.locator("[data-advantages=pending]").count() == 1
    shot(page, "run-live-group-scored")

    # The update stored the advantages: the same cards, now with them.
    as_worker(advantages_store, groups, [[1.22, -1.22, 0.0], [-1.0, 1.0]])
    card.locator("[data-advantages=known]").wait_for()
    assert card.locator("[data-advantages=known]").inner_text().split() == ["advantage", "+1.22", "-1.22", "0.00"]
    assert "training…" not in card.inner_text()
    assert page.locator("#groups-live > li").count() == 2
    best = card.locator("[data-answer=best] .quote").get_attribute("href")
    assert f"traj={groups[0].trajectories.get(index=0).id}" in best and "step=2" in best
    shot(page, "run-live-group-trained")

    # A reload rebuilds the same list from the database.
    page.reload()
    page.wait_for_function("window.__artwebLive && window.__artwebLive.state === 'open'")
    assert page.locator("#groups-live > li").count() == 2
    assert page.locator(f"[data-group='{groups[0].id}'] [data-advantages=known]").count() == 1
    assert_no_console_errors(page)


def test_it_lists_a_new_run_without_a_reload(signed_in, user):
    page = signed_in
    first = RunFactory(owner=user, name="older run", status="running")
    page.goto("/")
    page.wait_for_selector("#live-state[data-state=open]")

    def launch(name):
        return run_create(
            owner=user,
            name=name,
            base_model=first.base_model,
            script_version=first.script_version,
            reward_version=first.reward_version,
            scenario_set=first.scenario_set,
            config={"num_steps": 5},
            tags=["sweep"],
            start=False,
        )

    run = as_worker(launch, "brand new")
    row = page.locator(f"tr[data-run='{run.id}']")
    row.wait_for()
    assert page.locator("#runs-table tbody tr").first.get_attribute("data-run") == str(run.id)
    assert row.locator("a").first.inner_text() == "brand new"
    assert row.locator("[data-status]").inner_text() == "queued"
    assert row.locator("[data-steps]").inner_text() == "0/5"
    assert row.locator(".tag").inner_text() == "sweep"
    assert page.inner_text("#runs-count") == "2 runs"

    as_worker(run_transition, run=run, from_statuses=("queued",), to_status="starting")
    row.locator("[data-status]:has-text('starting')").wait_for()
    shot(page, "runs-list-new-run")

    # A filtered list does not guess whether the run belongs: it names it, with a link.
    page.goto("/?status=running")
    page.wait_for_selector("#live-state[data-state=open]")
    other = as_worker(launch, "another one")
    page.locator(f"#new-runs a[data-run='{other.id}']").wait_for()
    assert page.locator(f"tr[data-run='{other.id}']").count() == 0
    assert_no_console_errors(page)


def test_it_lists_a_first_run_on_an_empty_list(signed_in, user):
    page = signed_in
    script = RolloutScriptVersionFactory(asset__owner=user)
    scenarios = ScenarioSetFactory(owner=user)
    page.goto("/")
    page.wait_for_selector("#live-state[data-state=open]")
    assert page.locator("#runs-empty").is_visible()
    run = as_worker(
        run_create,
        owner=user,
        name="my first",
        base_model=BaseModelFactory(),
        script_version=script,
        scenario_set=scenarios,
        start=False,
    )
    page.locator(f"tr[data-run='{run.id}']").wait_for()
    assert page.locator("#runs-table").is_visible() and page.locator("#runs-empty").count() == 0
    assert page.inner_text("#runs-count") == "1 run"
    assert_no_console_errors(page)
