"""The scenario × step heatmap in a real browser (Debian's headless Chromium) against the ASGI server.

No worker runs here: the test plays it, persisting a scored group and broadcasting it in the same
transaction as the step loop does (the message leaves on commit through the real Redis channel layer
and consumer). The mouse moves and clicks on Plotly's own heatmap; __artwebHeatmap.cellCenter only
says where a cell is drawn.
"""

import re

import pytest
from django.db import transaction

from artweb.testing.factories import RunFactory, ScenarioSetFactory
from rollouts.models import Scenario
from tests.browser.conftest import shot
from tests.browser.test_dashboard import as_worker, assert_no_console_errors
from training.models import Trajectory, TrajectoryGroup
from training.services.broadcast import group_message, run_broadcast

pytestmark = pytest.mark.timeout(120)

# Train rewards, {step: {scenario index: reward}}: scenario 0 learns, 1 regresses (1.0 then 0.0),
# 2 is solved at step 3, 3 never is; step 2 has no group of scenario 2 (an empty cell).
REWARDS = {
    1: {0: 0.0, 1: 1.0, 2: 0.0, 3: 0.0},
    2: {0: 0.5, 1: 1.0, 3: 0.25},
    3: {0: 1.0, 1: 0.5, 2: 1.0, 3: 0.0},
    4: {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.25},
}


def _group(run, step, index, reward, split="train"):
    scenario = Scenario.objects.get(scenario_set=run.scenario_set, index=index)
    group = TrajectoryGroup.objects.create(run=run, step=step, split=split, scenario=scenario, reward_mean=reward)
    rows = Trajectory.objects.bulk_create(
        [
            Trajectory(
                group=group,
                run=run,
                step=step,
                index=i,
                reward=reward,
                messages=[
                    {"role": "user", "content": scenario.data["prompt"]},
                    {"role": "assistant", "content": f"answer {i}"},
                ],
            )
            for i in range(2)
        ]
    )
    return group, rows


def score_group(run, step, index, reward):
    """A worker persisting a scored group: broadcast from inside the transaction, sent on commit."""
    with transaction.atomic():
        group, rows = _group(run, step, index, reward)
        run_broadcast(run.id, group_message(group, rows))
    return group


@pytest.fixture
def seeded(user):
    scenario_set = ScenarioSetFactory(owner=user, train_count=4, validation_count=2)
    Scenario.objects.filter(scenario_set=scenario_set, index=2).update(
        data={"prompt": "<img src=x onerror=alert(1)> Spell 'two'", "answer": "two"}
    )
    run = RunFactory(owner=user, scenario_set=scenario_set, name="heat", status="running", num_steps=10)
    for step, rewards in REWARDS.items():
        for index, reward in rewards.items():
            _group(run, step, index, reward)
    _group(run, 4, 4, 0.5, split="validation")
    return run


def open_heatmap(page, run, query=""):
    page.goto(f"/runs/{run.id}/heatmap/{query}")
    page.wait_for_function("window.__artwebHeatmap && window.__artwebHeatmap.drawnAt !== null")
    # The cells were painted first as an image, which the interactive chart then replaced.
    state = page.evaluate("[window.__artwebHeatmap.previewAt, window.__artwebHeatmap.drawnAt]")
    if "sort=" not in query:
        assert state[0] is not None and state[0] <= state[1], state
    assert page.locator("#heatmap-preview").count() == 0


def cell_center(page, scenario, step):
    point = page.evaluate(f"window.__artwebHeatmap.cellCenter({scenario}, {step})")
    assert point, f"no cell drawn for scenario {scenario} at step {step}"
    return point["x"] - page.evaluate("window.scrollX"), point["y"] - page.evaluate("window.scrollY")


def hover(page, scenario, step):
    """Move the mouse over a cell and wait until the page says which cell it is over."""
    x, y = cell_center(page, scenario, step)
    page.mouse.move(x, y)
    page.wait_for_function(
        f"document.getElementById('heatmap-hover').dataset.scenario === '{scenario}' && "
        f"document.getElementById('heatmap-hover').dataset.step === '{step}'"
    )
    return x, y


def test_it_draws_each_scenarios_reward_per_step_and_opens_a_cell_in_the_inspector(signed_in, seeded):
    page = signed_in
    open_heatmap(page, seeded)
    assert "4 scenarios × 4 steps" in page.inner_text("#heatmap-summary")
    assert page.evaluate("window.__artwebHeatmap.order()") == [0, 1, 2, 3]
    assert page.evaluate("document.getElementById('heatmap').data[0].type") == "heatmap"
    assert page.evaluate("window.__artwebHeatmap.cell(2, 2)") == {"value": None, "groups": 0}
    shot(page, "heatmap-seeded")

    # Hovering a cell names its scenario, step and reward; the scenario's text stays text.
    hover(page, 2, 3)
    box = page.locator("#heatmap-hover")
    assert box.inner_text().startswith("Scenario 2 · step 3 · mean reward 1.000 (1 group) · {")
    assert "<img src=x onerror=alert(1)>" in box.inner_text() and page.locator("#heatmap-hover img").count() == 0

    # An empty cell says so, and clicking it opens nothing.
    x, y = hover(page, 2, 2)
    assert "step 2 · no group" in box.inner_text()
    page.mouse.click(x, y)
    page.wait_for_timeout(500)
    assert page.url.endswith(f"/runs/{seeded.id}/heatmap/")

    x, y = hover(page, 1, 4)  # Plotly clicks the point its hover found, as a person sees it before clicking
    page.mouse.click(x, y)
    page.wait_for_url(re.compile(r"/trajectories/\?"), wait_until="domcontentloaded")
    assert "step=4" in page.url and "split=train" in page.url and "scenario=1" in page.url
    groups = page.locator(".group")
    assert groups.count() == 1
    assert "Scenario 1" in groups.inner_text() and "mean 0.000" in groups.inner_text()
    assert page.input_value("#id_scenario") == "1"
    assert_no_console_errors(page)


def test_it_sorts_rows_by_regression_and_by_when_they_were_solved(signed_in, seeded):
    page = signed_in
    open_heatmap(page, seeded)
    page.select_option("#id_sort", "regressed")
    # Best earlier minus latest: 1 lost 1.0; 0, 2 and 3 end at their best so far (0): ties by index.
    page.wait_for_function("window.__artwebHeatmap.order()[0] === 1")
    assert page.evaluate("window.__artwebHeatmap.order()") == [1, 0, 2, 3]
    assert "sort=regressed" in page.url

    page.select_option("#id_sort", "solved")
    # Solved at ≥ 1.0 (the top of the scale): 1 at step 1, 0 and 2 at step 3 (by index), 3 never.
    page.wait_for_function("window.__artwebHeatmap.order()[0] === 1 && window.__artwebHeatmap.order()[3] === 3")
    assert page.evaluate("window.__artwebHeatmap.order()") == [1, 0, 2, 3]
    page.fill("#solved-at", "0.25")
    page.dispatch_event("#solved-at", "change")
    # At ≥ 0.25: 1 at step 1, 0 and 3 at step 2, 2 at step 3.
    page.wait_for_function("window.__artwebHeatmap.order().join() === '1,0,3,2'")

    page.reload()
    page.wait_for_function("window.__artwebHeatmap && window.__artwebHeatmap.drawnAt !== null")
    assert page.input_value("#id_sort") == "solved"
    assert_no_console_errors(page)


def test_it_switches_to_validation_groups(signed_in, seeded):
    page = signed_in
    open_heatmap(page, seeded)
    page.check("#heatmap-split input[value=validation]")
    page.wait_for_url(re.compile(r"split=validation"))
    page.wait_for_function("window.__artwebHeatmap && window.__artwebHeatmap.drawnAt !== null")
    assert "1 scenario × 1 step" in page.inner_text("#heatmap-summary")
    assert page.evaluate("window.__artwebHeatmap.cell(4, 4)")["value"] == pytest.approx(0.5, abs=0.003)
    assert_no_console_errors(page)


def test_it_folds_a_scored_group_into_its_cell_live_and_adds_new_steps(signed_in, seeded):
    page = signed_in
    open_heatmap(page, seeded)
    page.wait_for_function("window.__artwebHeatmap.state === 'open'")

    # Scenario 2 gets its step-2 group late: the empty cell fills without a reload.
    as_worker(score_group, seeded, 2, 2, 0.75)
    page.wait_for_function("window.__artwebHeatmap.cell(2, 2).groups === 1")
    assert page.evaluate("window.__artwebHeatmap.cell(2, 2)")["value"] == pytest.approx(0.75, abs=0.003)
    assert page.evaluate("window.__artwebHeatmap.live") == 1
    shot(page, "heatmap-live-cell")

    # Step 5 has no column yet: the page fetches the view again and draws it.
    as_worker(score_group, seeded, 5, 3, 1.0)
    page.wait_for_function("window.__artwebHeatmap.cell(3, 5) && window.__artwebHeatmap.cell(3, 5).groups === 1")
    assert "4 scenarios × 4 steps" in page.inner_text("#heatmap-summary")  # the summary is of the render
    # A reload rebuilds the same cells from the database.
    page.reload()
    page.wait_for_function("window.__artwebHeatmap && window.__artwebHeatmap.drawnAt !== null")
    assert page.evaluate("window.__artwebHeatmap.cell(2, 2)")["groups"] == 1
    assert "4 scenarios × 5 steps" in page.inner_text("#heatmap-summary")
    assert_no_console_errors(page)


def test_a_long_run_is_binned_and_a_click_zooms_to_single_steps(signed_in, user):
    page = signed_in
    run = RunFactory(owner=user, name="long", num_steps=900)
    scenario = run.scenario_set.scenarios.get(index=0)
    TrajectoryGroup.objects.bulk_create(
        [TrajectoryGroup(run=run, step=s, scenario=scenario, reward_mean=s / 900) for s in range(1, 901)]
    )
    open_heatmap(page, run)
    assert "binned" in page.inner_text("#heatmap-summary")
    assert page.evaluate("document.getElementById('heatmap').data[0].x.length") == 400

    x, y = cell_center(page, 0, 450)
    page.mouse.move(x, y)
    page.wait_for_function("document.getElementById('heatmap-hover').dataset.scenario === '0'")
    page.mouse.click(x, y)
    page.wait_for_url(re.compile(r"from=\d+&to=\d+|to=\d+&from=\d+|from=\d+.*to=\d+"))
    page.wait_for_function("window.__artwebHeatmap && window.__artwebHeatmap.drawnAt !== null")
    assert "binned" not in page.inner_text("#heatmap-summary")
    first, last = page.evaluate(
        "[document.getElementById('heatmap').data[0].x[0], document.getElementById('heatmap').data[0].x.at(-1)]"
    )
    assert first <= 450 <= last and last - first == 399
    assert_no_console_errors(page)


def test_a_backwards_step_range_says_what_to_fix(signed_in, seeded):
    page = signed_in
    page.goto(f"/runs/{seeded.id}/heatmap/?from=9&to=2")
    assert "'from' (9) is after 'to' (2)" in page.inner_text("[role=alert]")
    assert page.locator("#heatmap").count() == 0
    assert_no_console_errors(page)
