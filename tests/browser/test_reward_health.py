"""The reward-health page and the launch page's "Score the base model's answers", in a real browser.

No worker runs here: the test plays the worker by committing trajectories and broadcasting the step
message as the step loop does (run_broadcast inside the writing transaction: it leaves on commit,
through the real Redis channel layer and the run's consumer). Screenshots go to tests/artifacts/.
"""

import pytest
from django.db import transaction

from artweb.testing.factories import (
    BaseModelFactory,
    RewardFunctionVersionFactory,
    RolloutScriptVersionFactory,
    RunFactory,
    ScenarioSetFactory,
    TrajectoryFactory,
    TrajectoryGroupFactory,
)
from tests.browser.conftest import shot
from tests.browser.test_dashboard import as_worker, assert_no_console_errors
from training.services.broadcast import run_broadcast

pytestmark = pytest.mark.timeout(120)

ZERO_DIV = "The reward function failed: ZeroDivisionError: division by zero"
KEY_ERROR = "The reward function failed: KeyError: 'answer'\n\nTraceback (your code, most recent call last):"
REWARD_TIMEOUT = "Timed out: the reward did not finish within 20 s (wall clock)."
ROLLOUT_TIMEOUT = "Timed out: the rollout did not finish within 20 s (wall clock)."


def _step(run, step, rows):
    """One group of trajectories at `step`; rows: (reward_ms, error)."""
    group = TrajectoryGroupFactory(run=run, step=step)
    return [
        TrajectoryFactory(group=group, index=i, reward_ms=ms, error=error, reward=None if error else 0.5)
        for i, (ms, error) in enumerate(rows)
    ]


def _rows(page, selector):
    return [row.split("\t") for row in page.locator(f"{selector} tbody tr").all_inner_texts()]


def _open(page, run):
    page.goto(f"/runs/{run.id}/health/")
    # Drawn from the page's data, then again once the socket opened (it fetches what the render missed).
    page.wait_for_function(
        "window.__artwebHealth && window.__artwebHealth.socket === 'open' && window.__artwebHealth.drawn >= 2"
    )


def test_it_shows_errors_latency_and_the_slowest_rewards_of_a_run(signed_in, user):
    page = signed_in
    run = RunFactory(owner=user, name="healthy?", status="completed")
    first = _step(run, 1, [(10, ""), (30, ZERO_DIV), (20, "")])
    second = _step(run, 2, [(400, REWARD_TIMEOUT), (50, ZERO_DIV), (None, ROLLOUT_TIMEOUT)])
    _open(page, run)

    # Reward times 10 20 30 50 400: p50 30, p95 at rank 3.8 = 50 + 0.8 * 350 = 330, max 400.
    assert page.inner_text("#health-trajectories") == "6" and page.inner_text("#health-timed") == "5"
    assert [page.inner_text(f"#health-{q}") for q in ("p50", "p95", "max")] == ["30 ms", "330 ms", "400 ms"]
    errors = _rows(page, "#health-errors")
    assert [row[:3] for row in errors] == [
        ["reward", "ZeroDivisionError", "2"],
        ["timeout", "Timed out: the reward did not finish within N s (wall clock).", "1"],
        ["rollout", "Timed out: the rollout did not finish within N s (wall clock).", "1"],
    ]
    assert errors[0][3].startswith(f"#{first[1].id} (step 1)")
    slowest = _rows(page, "#health-slowest")
    assert [(row[0], row[1], row[2]) for row in slowest] == [
        (f"#{second[0].id}", "2", "400 ms"),
        (f"#{second[1].id}", "2", "50 ms"),
        (f"#{first[1].id}", "1", "30 ms"),
        (f"#{first[2].id}", "1", "20 ms"),
        (f"#{first[0].id}", "1", "10 ms"),
    ]
    # Plotly drew both per-step charts: p50 and p95 lines, and the error share.
    assert page.locator("#chart-latency .scatterlayer .trace").count() == 2
    assert page.locator("#chart-errors .barlayer .trace").count() == 1
    shot(page, "reward-health")

    # The example opens the trajectory in the inspector, at its step.
    page.click("#health-errors tbody tr[data-type=ZeroDivisionError] a")
    page.wait_for_url(f"**/runs/{run.id}/trajectories/?step=1&traj={first[1].id}")
    assert ZERO_DIV in page.content()
    assert_no_console_errors(page)


def test_it_refreshes_when_the_runs_socket_brings_a_step(signed_in, user):
    page = signed_in
    run = RunFactory(owner=user, name="live health", status="running", num_steps=5)
    _step(run, 1, [(10, ""), (20, "")])
    _open(page, run)
    assert page.locator("#health-errors tbody tr").count() == 0 and page.is_visible("#health-errors-empty")
    drawn = page.evaluate("window.__artwebHealth.drawn")

    def write_step(broadcast: bool):
        with transaction.atomic():
            _step(run, 2, [(900, KEY_ERROR), (30, "")])
            if broadcast:
                run_broadcast(run.id, {"type": "step", "run": run.id, "step": 2, "metrics": {}})

    # Rows written without a message: the page does not poll, so nothing changes.
    as_worker(write_step, False)
    page.wait_for_timeout(1500)
    assert page.evaluate("window.__artwebHealth.drawn") == drawn
    assert page.locator("#health-errors tbody tr").count() == 0

    # The step's message arrives over the channel layer: the page fetches the API and redraws.
    as_worker(write_step, True)
    page.locator("#health-errors tbody tr[data-type=KeyError]").wait_for()
    assert _rows(page, "#health-errors")[0][:3] == ["reward", "KeyError", "2"]
    assert page.inner_text("#health-max") == "900 ms"
    assert _rows(page, "#health-slowest")[0][1:3] == ["2", "900 ms"]
    assert page.is_hidden("#health-errors-empty")
    shot(page, "reward-health-live")

    # A reload rebuilds the same panel from the database.
    page.reload()
    page.locator("#health-errors tbody tr[data-type=KeyError]").wait_for()
    assert page.inner_text("#health-trajectories") == "6"
    assert_no_console_errors(page)


def test_the_launch_page_opens_the_dry_run_form_prefilled_to_score_answers(signed_in, user):
    page = signed_in
    BaseModelFactory()
    first = RolloutScriptVersionFactory(asset__owner=user, asset__name="a-agent")
    second = RolloutScriptVersionFactory(asset__owner=user, asset__name="b-agent")
    reward = RewardFunctionVersionFactory(asset__owner=user, asset__name="exact")
    words = ScenarioSetFactory(owner=user, name="words", train_count=8, validation_count=2)
    ScenarioSetFactory(owner=user, name="another")

    page.goto("/runs/new/")
    page.select_option("#id_script_version", str(second.id))
    page.select_option("#id_reward_version", str(reward.id))
    page.select_option("#id_scenario_set", str(words.id))
    with page.context.expect_page() as opened:
        page.click("text=Score the base model's answers")
    form = opened.value
    form.wait_for_load_state()
    assert form.url.split("?")[0].endswith("/dry-runs/new/")
    assert form.input_value("#id_script_version") == str(second.id) != str(first.id)
    assert form.input_value("#id_reward_version") == str(reward.id)
    assert form.input_value("#id_scenario_set") == str(words.id)
    assert form.input_value("#id_samples") == "4" and form.input_value("#id_scenario_count") == "8"
    shot(form, "score-base-answers-form")

    form.click("main form button[type=submit]")
    form.wait_for_url("**/dry-runs/*/")
    assert "8 scenarios · 4 samples each" in " ".join(form.inner_text("main").split())
    # What it waits for: no GPU worker here, or one that a test's worker left marked alive a moment ago.
    waiting = form.inner_text("#dry-run-waiting")
    assert waiting.startswith(("No GPU worker is running", "Queued:")), waiting
    assert_no_console_errors(page)
