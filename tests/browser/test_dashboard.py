"""The dashboard in a real browser (Debian's headless Chromium) against the ASGI server.

No GPU worker runs here: the test plays the worker by committing Step rows and broadcasting them
exactly as the step loop does (training.services.broadcast.run_broadcast inside the transaction that
writes the row, so the message leaves on commit). Screenshots go to tests/artifacts/.
"""

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection as db_connection
from django.db import transaction

from artweb.testing.factories import (
    REWARD,
    SCRIPT,
    BaseModelFactory,
    RunFactory,
    StepFactory,
    TrajectoryFactory,
    TrajectoryGroupFactory,
)
from tests.browser.conftest import shot
from training.models import Run, Step
from training.services.broadcast import run_broadcast

pytestmark = pytest.mark.timeout(120)

BROKEN_SCRIPT = "import art\n\n\nasync def rollout(model, scenario)\n    return None\n"
SCENARIOS = "\n".join(
    json.dumps({"prompt": f"Say w{i}", "answer": f"w{i}", **({"split": "validation"} if i < 2 else {})})
    for i in range(8)
)


def as_worker(fn, *args, **kwargs):
    """Run fn in a thread of its own, as the worker process would: Playwright's event loop on the test
    thread rules out async_to_sync there, and the thread's database connection is closed after."""

    def call():
        try:
            return fn(*args, **kwargs)
        finally:
            db_connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


def commit_step(run: Run, step: int, reward: float) -> None:
    """What the step loop does at the end of a step: persist, then broadcast on commit."""
    as_worker(_commit_step, run, step, reward)


def _commit_step(run: Run, step: int, reward: float) -> None:
    metrics = {
        "reward_mean": reward,
        "reward_std": 0.1,
        "loss": 0.5 / step,
        "kl": 0.001 * step,
        "grad_norm": 1.0,
        "completion_tokens_mean": 40.0,
        "tokens_per_second": 900.0,
    }
    timings = {"step": 2.0}
    with transaction.atomic():
        Run.objects.filter(id=run.id).update(steps_done=step, latest_reward=reward)
        Step.objects.create(
            run=run, step=step, reward_mean=reward, reward_std=0.1, metrics=metrics, timings=timings, duration_s=2.0
        )
        run_broadcast(
            run.id,
            {
                "type": "step",
                "run": run.id,
                "step": step,
                "metrics": {**metrics, "duration_s": timings["step"]},
                "timings": timings,
                "steps_done": step,
                "num_steps": run.num_steps,
            },
            to_list=True,
        )


def points(page, chart: str, trace: int = 0) -> int:
    return page.evaluate(f"document.getElementById('{chart}').data[{trace}].x.length")


def assert_no_console_errors(page):
    assert not page.console_errors, page.console_errors


def test_it_uploads_code_shows_inline_errors_and_launches_a_run(signed_in):
    page = signed_in
    BaseModelFactory()

    page.goto("/scripts/new/")
    page.fill("#id_name", "broken-agent")
    page.fill("#id_content", BROKEN_SCRIPT)
    page.click("button[type=submit].primary")
    error = page.locator("#id_content_errors")
    assert "line 4" in error.inner_text()
    assert page.locator("#code-errors .bad").inner_text().startswith("4")
    shot(page, "upload-inline-error")

    page.fill("#id_name", "agent")
    page.fill("#id_content", SCRIPT)
    page.click("button[type=submit].primary")
    page.wait_for_url(re.compile(r"/scripts/\d+/$"))
    assert "agent" in page.locator("h1").inner_text()

    page.goto("/rewards/new/")
    page.fill("#id_name", "exact-match")
    page.fill("#id_content", REWARD)
    page.click("button[type=submit].primary")
    page.wait_for_url(re.compile(r"/rewards/\d+/$"))

    page.goto("/scenarios/new/")
    page.fill("#id_name", "words")
    page.fill("#id_content", SCENARIOS)
    page.click("button[type=submit].primary")
    page.wait_for_url(re.compile(r"/scenarios/\d+/$"))
    # Two lines marked "validation", and of the six unmarked 0.2 is held out (rounded: one).
    assert "5 training and 3 validation" in page.inner_text("main")

    page.goto("/runs/new/")
    page.fill("#id_name", "first run")
    page.select_option("#id_script_version", label="agent v1")
    page.select_option("#id_reward_version", label="exact-match v1 (trajectory)")
    page.fill("#id_group_size", "1")  # below the bound: an inline error, nothing created
    page.click("button[type=submit].primary")
    assert "greater than or equal to 2" in page.locator("#id_group_size_errors").inner_text()
    assert not Run.objects.exists()
    shot(page, "launch-inline-error")

    page.fill("#id_group_size", "4")
    page.fill("#id_num_steps", "3")
    page.click("button[type=submit].primary")
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    assert "first run" in page.locator("h1").inner_text()
    run = Run.objects.get(name="first run")
    assert run.config["group_size"] == 4 and run.num_steps == 3
    shot(page, "run-launched")
    assert_no_console_errors(page)


def test_it_draws_live_points_over_the_websocket(signed_in, user):
    page = signed_in
    run = RunFactory(owner=user, name="live-run", num_steps=40, status="running", steps_done=5)
    for i in range(1, 6):
        StepFactory(
            run=run,
            step=i,
            reward_mean=0.1 * i,
            reward_std=0.05,
            metrics={"loss": 1.0 / i, "kl": 0.01 * i, "grad_norm": 1.0, "tokens_per_second": 800.0},
            timings={"step": 2.0},
            duration_s=2.0,
        )

    page.goto(f"/runs/{run.id}/")
    page.wait_for_function("window.__artwebLive && window.__artwebLive.state === 'open'")
    assert points(page, "chart-loss") == 5
    assert points(page, "chart-reward", trace=2) == 5

    for step in range(6, 9):
        commit_step(run, step, reward=0.1 * step)
        page.wait_for_function(f"document.getElementById('chart-loss').data[0].x.length === {step}")
    assert points(page, "chart-reward", trace=2) == 8
    assert page.inner_text("#run-steps") == "8 / 40"
    assert page.inner_text("#run-latest") == "0.800"

    from training.services import run_pause

    as_worker(run_pause, run=run, actor=user)  # running: a pause request, shown on the timeline
    page.click("#tab-timeline")
    page.wait_for_selector("#events li:has-text('Pause requested')")
    page.click("#tab-charts")
    page.fill("#smoothing", "0.6")
    page.dispatch_event("#smoothing", "input")
    assert page.evaluate("document.getElementById('chart-loss').data[1].visible") is True
    shot(page, "run-live")

    page.click("#theme-toggle")
    assert page.evaluate("document.documentElement.dataset.theme") in ("dark", "light")
    shot(page, "run-theme-toggled")

    # The runs list follows progress over ws/runs/.
    page.goto("/")
    page.wait_for_selector("#live-state[data-state=open]")
    commit_step(run, 9, reward=0.95)
    row = page.locator(f"tr[data-run='{run.id}']")
    row.locator("[data-steps]:has-text('9/40')").wait_for()
    assert row.locator("[data-latest]").inner_text() == "0.950"
    shot(page, "runs-list")
    assert_no_console_errors(page)


def test_it_opens_a_trajectory_in_the_inspector(signed_in, user):
    page = signed_in
    run = RunFactory(owner=user, name="inspect-me", num_steps=3, steps_done=2)
    for step in (1, 2):
        for g in range(3):
            group = TrajectoryGroupFactory(run=run, step=step, reward_mean=0.5, reward_std=0.5)
            for i in range(4):
                TrajectoryFactory(
                    group=group,
                    index=i,
                    reward=float(i % 2),
                    advantage=(1.0 if i % 2 else -1.0),
                    completion_tokens=12,
                    messages=[
                        {"role": "system", "content": "Answer with one word."},
                        {"role": "user", "content": f"Say the word w{g}"},
                        {
                            "role": "assistant",
                            "content": None,
                            "token_ids": [5, 6],
                            "tool_calls": [
                                {
                                    "id": "c1",
                                    "type": "function",
                                    "function": {"name": "dictionary", "arguments": json.dumps({"word": f"w{g}"})},
                                }
                            ],
                        },
                        {"role": "tool", "tool_call_id": "c1", "content": "a word"},
                        {"role": "assistant", "content": f"w{g} (step {step}, #{i})", "token_ids": [7]},
                    ],
                    search_text=f"w{g} step {step} #{i}",
                )

    page.goto(f"/runs/{run.id}/trajectories/")
    assert page.locator(".group").count() == 3
    assert page.input_value("#id_step") == "2"
    page.locator(".group a.traj").nth(1).click()
    page.wait_for_selector("#trajectory")
    transcript = page.inner_text("#trajectory")
    assert "Say the word w0" in transcript and "dictionary" in transcript and "a word" in transcript
    assert "(step 2, #1)" in transcript
    shot(page, "trajectory")

    page.focus("#step-slider")
    page.keyboard.press("ArrowLeft")  # keyboard: previous step
    page.wait_for_url("**step=1**")
    assert page.input_value("#id_step") == "1"
    page.fill("#id_min_reward", "1")
    page.click("#inspector-filters button[type=submit]")
    assert page.locator(".group a.traj").count() == 6  # the rewarded half
    assert_no_console_errors(page)


def test_it_compares_two_runs(signed_in, user):
    page = signed_in
    a = RunFactory(owner=user, name="lr-small", config={"group_size": 6, "train": {"learning_rate": 1e-6}})
    b = RunFactory(
        owner=user,
        name="lr-big",
        config={"group_size": 6, "train": {"learning_rate": 1e-5}},
        script_version=a.script_version,
        reward_version=a.reward_version,
        scenario_set=a.scenario_set,
    )
    for run, slope in ((a, 0.01), (b, 0.03)):
        for i in range(1, 21):
            StepFactory(run=run, step=i, reward_mean=slope * i, metrics={"loss": 1.0 / i, "kl": 0.0, "grad_norm": 1.0})

    page.goto("/")
    page.check(f"input[name=runs][value='{a.id}']")
    page.check(f"input[name=runs][value='{b.id}']")
    page.click("#compare-form button[type=submit]")
    page.wait_for_url("**/compare/**")
    page.wait_for_selector("#compare-reward .main-svg")
    assert page.evaluate("document.getElementById('compare-reward').data.length") == 2
    diff = page.inner_text("#config-diff")
    assert "train.learning_rate" in diff and "group_size" not in diff
    shot(page, "compare")
    assert_no_console_errors(page)


def test_a_failed_steps_rollouts_are_shown_with_their_errors_in_the_inspector(signed_in, user):
    page = signed_in
    run = RunFactory(
        owner=user,
        name="failed-step",
        num_steps=3,
        steps_done=1,
        status=Run.Status.FAILED,
        error="StepFailed: 2 of 2 rollouts failed",
    )
    group = TrajectoryGroupFactory(
        run=run, step=2, reward_mean=None, reward_std=None, error_count=2, failed_attempt=True
    )
    for i in range(2):
        TrajectoryFactory(
            group=group, index=i, reward=None, error=f"RuntimeError: rollout {i} broke", logs=[f"rollout {i} starting"]
        )
    page.goto(f"/runs/{run.id}/trajectories/?step=2")
    head = page.inner_text(".group")
    assert "failed attempt" in head and "2 errors" in head
    page.locator(".group a.traj").nth(1).click()
    page.wait_for_selector("#trajectory")
    body = page.inner_text("main")
    assert "RuntimeError: rollout 1 broke" in body and "rollout 1 starting" in body
    shot(page, "failed-attempt")
    assert_no_console_errors(page)


def test_the_launch_form_follows_the_chosen_script_and_model(signed_in, user):
    from artweb.testing.factories import RewardFunctionVersionFactory, RolloutScriptVersionFactory, ScenarioSetFactory

    page = signed_in
    BaseModelFactory(name="a-small", recommended_train={"learning_rate": 0.0002})
    BaseModelFactory(name="b-plain", source="org/plain")
    plain = RolloutScriptVersionFactory(asset__owner=user, asset__name="a-plain")
    paired = RolloutScriptVersionFactory(asset__owner=user, asset__name="b-paired")
    RewardFunctionVersionFactory(asset__owner=user, asset__name="a-other")
    companion = RewardFunctionVersionFactory(asset__owner=user, asset__name="b-companion")
    paired.asset.companion_reward = companion.asset
    paired.asset.save()
    ScenarioSetFactory(owner=user)

    page.goto("/runs/new/")
    assert page.input_value("#id_script_version") == str(plain.id)
    assert page.input_value("#id_reward_version") == ""  # the first script has no companion
    assert "Recommended for a-small: learning_rate 0.0002" in page.inner_text("#recommended-train")
    page.select_option("#id_script_version", str(paired.id))
    assert page.input_value("#id_reward_version") == str(companion.id)
    page.select_option("#id_base_model", label="b-plain")
    assert "no recommendations are stored for this model" in page.inner_text("#recommended-train")
    shot(page, "launch-defaults")
    assert_no_console_errors(page)
