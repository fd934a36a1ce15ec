"""The learning-signal monitor and its alerts on the run page, in a real browser against the ASGI server.

No worker runs here: steps are written and their messages sent as the step loop does (on commit, through
the real Redis channel layer), and the alerts are raised by the service the worker calls after a step.
"""

import pytest
from django.db import transaction

from artweb.testing.factories import RunFactory, StepFactory, TrajectoryGroupFactory
from tests.browser.conftest import shot
from tests.browser.test_dashboard import as_worker, assert_no_console_errors, points
from training.analytics.alerts import run_alerts_check
from training.models import Run, Step
from training.services.broadcast import run_broadcast

pytestmark = pytest.mark.timeout(120)

SIGNAL_CHARTS = ("chart-dead", "chart-effective", "chart-adv", "chart-mismatch", "chart-trunc", "chart-entropy")


def _metrics(step: int, *, dead: bool = False) -> dict:
    return {
        "reward_mean": 0.5,
        "groups": 4,
        "groups_no_signal": 4 if dead else 1,
        "dead_group_share": 1.0 if dead else 0.25,
        "effective_batch": 0 if dead else 18,
        "advantage_std": 0.0 if dead else 0.9,
        "sampler_kl": 0.002 * step,
        "truncation_rate": 0.1,
        "entropy": 2.0 - 0.1 * step,
        "completion_tokens_mean": 30.0,
    }


def _commit(run: Run, step: int, metrics: dict) -> None:
    with transaction.atomic():
        Run.objects.filter(id=run.id).update(steps_done=step)
        Step.objects.create(
            run=run, step=step, reward_mean=0.5, reward_std=0.0, metrics=metrics, timings={"step": 1.0}, duration_s=1.0
        )
        TrajectoryGroupFactory(run=run, step=step, split="train", reward_mean=0.5, reward_std=0.0)
        run_broadcast(
            run.id,
            {
                "type": "step",
                "run": run.id,
                "step": step,
                "metrics": {**metrics, "duration_s": 1.0},
                "timings": {"step": 1.0},
                "steps_done": step,
                "num_steps": run.num_steps,
            },
        )
    run_alerts_check(run=run, step=step)


def test_the_monitor_draws_seeded_steps_and_live_ones_and_an_alert_appears_live(signed_in, user):
    page = signed_in
    run = RunFactory(owner=user, name="monitored", num_steps=20, status="running", steps_done=3)
    for step in range(1, 4):
        StepFactory(run=run, step=step, metrics=_metrics(step))
    page.goto(f"/runs/{run.id}/")
    page.wait_for_function("window.__artwebLive && window.__artwebLive.state === 'open'")
    for chart in SIGNAL_CHARTS:
        page.locator(f"#{chart}").scroll_into_view_if_needed()  # charts out of view draw when they come into it
        page.wait_for_function(f"document.getElementById('{chart}').data[0].x.length === 3")
        assert points(page, chart) == 3, chart
    assert page.evaluate("document.getElementById('chart-dead').data[0].y[0]") == 0.25

    # Three dead steps in a row: the points arrive live, then the no-signal alert as a banner with its link.
    page.locator("#chart-effective").scroll_into_view_if_needed()
    for step in range(4, 7):
        as_worker(_commit, run, step, _metrics(step, dead=True))
        page.wait_for_function(f"document.getElementById('chart-effective').data[0].x.length === {step}")
    banner = page.locator("#run-warnings [data-kind=no_signal]")
    banner.wait_for()
    assert "No learning signal in steps 4-6" in banner.inner_text()
    assert banner.locator("a").get_attribute("href") == f"/runs/{run.id}/trajectories/?step=6&split=train"
    page.locator("#chart-dead").scroll_into_view_if_needed()
    page.wait_for_function("document.getElementById('chart-dead').data[0].y.at(-1) === 1")
    shot(page, "run-signal-monitor")
    assert_no_console_errors(page)


def test_the_alert_rules_are_edited_in_the_config_tab(signed_in, user):
    page = signed_in
    run = RunFactory(owner=user, name="rules", num_steps=20, status="running")
    page.goto(f"/runs/{run.id}/#config")
    form = page.locator("#alerts-form")
    assert form.locator("[name=no_signal_steps]").input_value() == "3"
    form.locator("[name=no_signal_steps]").fill("6")
    form.locator("[name=pause_on_alert]").check()
    form.locator("button[type=submit]").click()
    page.wait_for_selector("text=Alert rules saved")
    run.refresh_from_db()
    assert run.config["alerts"]["no_signal_steps"] == 6 and run.config["alerts"]["pause_on_alert"] is True
    page.click("#tab-config")
    assert page.locator("#alerts-form [name=no_signal_steps]").input_value() == "6"

    page.locator("#alerts-form [name=length_drift]").fill("-2")
    page.locator("#alerts-form button[type=submit]").click()
    # The browser's own check refuses it first (the field's minimum), so nothing is posted or lost.
    assert page.evaluate("document.querySelector('#alerts-form [name=length_drift]').validity.valid") is False
    run.refresh_from_db()
    assert run.config["alerts"]["no_signal_steps"] == 6
    assert_no_console_errors(page)
