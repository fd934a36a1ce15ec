"""A new user's path through artweb, in Chromium, against the product started as `make run` starts it.

`python -m artweb.launcher run` on a fresh data dir, with none of the test session's settings
(artweb.testing.launched): its own PostgreSQL and Redis, the default model, the admin, the demo task, the
web server and both workers. Then, as the admin whose password it printed: the demo launched from the
form with its defaults, its run watched live to the end without a reload, a trajectory in the inspector,
the heatmap, the playground asking what the run trained, a dry run of a script whose rollout hangs, and a
base model registered under a Hugging Face id that does not exist; finally Ctrl-C, after which nothing of
the product is left running. Each step asserts what the page shows the user. (`make run` installs first:
here the test session's own virtual environment is the installed one.)

Nothing is mocked; the whole path takes minutes on two cores (the default run's 20 steps, the inference
server's first start and the dry run's 90 s limit most of it). Each stage's time is printed.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from artweb.testing.launched import ROOT, Launched
from artweb.testing.web import CHROMIUM, CHROMIUM_ARGS
from tests.browser.conftest import ARTIFACTS, shot
from tests.browser.test_dashboard import assert_no_console_errors
from tests.browser.test_run_page_live import CHART_IDS, charts, summary

pytestmark = [
    pytest.mark.browser,
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.worker,
    pytest.mark.vllm,  # the GPU worker starts vLLM, or CTranslate2 where its CPU probe finds no bf16 speed-up
    pytest.mark.ct2,
    pytest.mark.timeout(5400),
]

MINUTE = 60_000  # ms, Playwright's unit
DEMO = "Example rollout on SmolLM2-135M-Instruct"
DEMO_STEPS = 20  # the launch form's default num_steps (training.config.RunConfig)
# A rollout whose tool never answers and that swallows the cancellation of its own time limit: only the
# batch's deadline stops it (the dry run's: 90 s for up to 16 rollouts, its shortest).
HANGING_SCRIPT = """import asyncio

import art


async def rollout(model: art.Model, scenario) -> art.Trajectory:
    print("waiting for the weather tool")
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            print("cancelled; waiting on regardless")
"""
BAD_HF_ID = "no-such-org/no-such-model-xyz"
# What each field of the run page showed, in order, recorded by the page itself: no change is missed
# between two looks, and a reload would drop the record.
RECORDER_JS = """() => {
  const ids = ["run-status", "run-steps", "run-latest", "run-best", "run-started", "checkpoints-count"];
  const text = (id) => document.getElementById(id).textContent.trim();
  const seen = Object.fromEntries(ids.map((id) => [id, [text(id)]]));
  const note = () => ids.forEach((id) => { const s = seen[id]; if (s[s.length - 1] !== text(id)) s.push(text(id)); });
  new MutationObserver(note).observe(document.body, { subtree: true, childList: true, characterData: true });
  window.__newUserSeen = seen;
}"""
FINAL = ("completed", "failed", "cancelled")


@pytest.fixture(scope="module")
def chromium():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def product(chromium):
    ARTIFACTS.mkdir(exist_ok=True)
    # Not under pytest's temporary root: run as root, the embedded PostgreSQL runs as a system user that
    # needs the search bit on every directory above its own, and each pytest session that starts on the
    # machine meanwhile makes that root 0700 again (the server then stops with "Permission denied").
    home = Path(tempfile.mkdtemp(prefix="artweb-new-user-"))
    launched = Launched(home / "data", ARTIFACTS / "new-user-launcher.log")
    try:
        yield launched
    finally:
        # The test stops it itself and checks what is left; this is for a test that failed on the way.
        launched.stop()
        launched.stop_leftovers()
        shutil.rmtree(home, ignore_errors=True)  # a model, checkpoints, a database: hundreds of MB


@pytest.fixture
def new_user(chromium, product):
    """A browser page of the product's own, once it is up (its address is known only then)."""
    started = time.monotonic()
    product.start(timeout=1200)
    print(f"\n[new user] `make run` up in {time.monotonic() - started:.0f} s at {product.url}")
    context = chromium.new_context(base_url=product.url, viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(60_000)
    page = context.new_page()
    page.console_errors = []
    page.on("console", lambda m: m.type == "error" and page.console_errors.append(m.text))
    page.on("pageerror", lambda e: page.console_errors.append(str(e)))
    yield page
    context.close()


@contextmanager
def stage(name: str):
    started = time.monotonic()
    yield
    print(f"[new user] {name}: {time.monotonic() - started:.0f} s", flush=True)


def test_a_new_user_trains_the_demo_and_meets_the_errors_they_can_fix(new_user, product):
    page = new_user
    with stage("sign in"):
        sign_in(page, product)
    with stage("launch the demo with the form's defaults"):
        run_id = launch_demo(page)
    with stage("watch the run live to its end"):
        watch_run(page, product)
    with stage("inspector"):
        inspect_a_trajectory(page)
    with stage("heatmap"):
        open_heatmap(page)
    with stage("playground"):
        ask_the_playground(page, run_id)
    with stage("dry run of a hanging script"):
        dry_run_a_hanging_script(page)
    with stage("register a bad Hugging Face id"):
        register_a_bad_hub_id(page, product)
    assert_no_console_errors(page)
    with stage("Ctrl-C"):
        stop_with_ctrl_c(product)


def nav(page, name: str) -> None:
    """Follow a link of the bar at the top of every page."""
    page.get_by_role("navigation", name="Main").get_by_role("link", name=name, exact=True).click()


def sign_in(page, product) -> None:
    assert product.username == "admin" and product.password
    page.goto("/")
    page.wait_for_url("**/accounts/login/**")  # signed out: every page asks to sign in first
    page.fill("#id_username", product.username)
    page.fill("#id_password", product.password)
    page.click("button[type=submit]")
    page.wait_for_url(product.url)
    assert page.locator("h1").first.inner_text().strip() == "Runs"
    assert "No runs" in page.inner_text("#runs-empty")


def launch_demo(page) -> int:
    """The demo as the quick start says: Launch a run, the form already filled in, Launch."""
    page.get_by_role("link", name="Launch a run").click()
    page.wait_for_url("**/runs/new/")
    chosen = {
        field: page.locator(f"#id_{field} option:checked").inner_text().strip()
        for field in ("base_model", "script_version", "reward_version", "scenario_set")
    }
    assert chosen == {
        "base_model": "SmolLM2-135M-Instruct",
        "script_version": "Example rollout v1",
        "reward_version": "Example reward v1 (trajectory)",
        "scenario_set": "Example scenarios (48 train / 12 validation)",
    }
    assert page.input_value("#id_name") == ""  # named after its script, model and time
    assert page.input_value("#id_num_steps") == str(DEMO_STEPS)
    assert "Recommended for SmolLM2-135M-Instruct: learning_rate 0.0002" in page.inner_text("#recommended-train")
    shot(page, "new-user-launch-form")
    page.click("button[type=submit].primary")
    page.wait_for_url(re.compile(r"/runs/\d+/(#.*)?$"))
    assert page.locator("h1").inner_text().startswith(DEMO)
    return int(re.search(r"/runs/(\d+)/", page.url)[1])


def watch_run(page, product) -> None:
    """The run page, open from the launch on and never reloaded, follows the run to its end."""
    page.wait_for_function("window.__artwebLive && window.__artwebLive.state === 'open'")
    first = summary(page)
    assert first["status"] in ("queued", "starting"), first
    assert (first["steps"], first["best"], first["started"], first["tab"]) == (
        f"0 / {DEMO_STEPS}",
        "—",
        "—",
        "Checkpoints (0)",
    )
    assert all(c["x"] == [] and c["empty"] for c in charts(page).values())
    page.evaluate(RECORDER_JS)

    # The first step: the inference server's first start comes before it (minutes on a busy CPU).
    wait_on_run(page, product, "document.getElementById('run-steps').textContent.startsWith('1 /')", 30)
    shown = summary(page)
    assert shown["status"] == "running" and re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", shown["started"]), shown
    assert shown["tab"] == "Checkpoints (1)" and re.fullmatch(r"\d\.\d{3}", shown["latest"]), shown
    page.wait_for_function("document.getElementById('chart-reward').data.some((t) => t.name === 'raw' && t.x.length)")
    shot(page, "new-user-run-first-step")

    wait_on_run(page, product, f"{list(FINAL)}.includes(document.getElementById('run-status').textContent.trim())", 45)
    final = summary(page)
    assert final["status"] == "completed", f"the demo run ended {final['status']}: {page.inner_text('#run-error')}"
    assert not final["error_shown"] and final["steps"] == f"{DEMO_STEPS} / {DEMO_STEPS}", final

    seen = page.evaluate("window.__newUserSeen")
    assert seen is not None, "the run page was reloaded while the run went on"
    print(f"[new user] the run page showed, live: {seen}")
    statuses = seen["run-status"]
    assert statuses[-1] == "completed" and "running" in statuses and "failed" not in statuses, statuses
    steps = [int(s.split(" / ")[0]) for s in seen["run-steps"]]
    assert steps[0] == 0 and steps[-1] == DEMO_STEPS and steps == sorted(set(steps)) and len(steps) > 3, steps
    counts = [int(c) for c in seen["checkpoints-count"]]
    assert counts[0] == 0 and counts == sorted(set(counts)) and len(counts) > 3, counts
    assert seen["run-started"][0] == "—" and seen["run-started"][-1] == final["started"] != "—", seen["run-started"]
    assert seen["run-best"][0] == "—" and re.fullmatch(r"\d\.\d{3}", final["best"]), seen["run-best"]
    # Every step arrived over the socket and was drawn: one point each on the reward chart.
    received = page.evaluate("Object.keys(window.__artwebLive.received).map(Number).sort((a, b) => a - b)")
    assert received == list(range(1, DEMO_STEPS + 1)), received
    page.wait_for_function(
        "(n) => document.getElementById('chart-reward').data.find((t) => t.name === 'raw').x.length === n",
        arg=DEMO_STEPS,
    )
    drawn = charts(page)
    assert drawn["reward"]["x"] == list(range(1, DEMO_STEPS + 1))
    # The page rounds half up (0.8125 shows as 0.813) where Python's format rounds to even (0.812).
    best = max(drawn["val"]["y"]) if drawn["val"]["x"] else None
    assert best is not None and abs(best - float(final["best"])) <= 0.0005 + 1e-9, (drawn["val"], final["best"])
    assert set(drawn) == set(CHART_IDS)
    shot(page, "new-user-run-completed")


def wait_on_run(page, product, condition: str, minutes: float) -> None:
    """Wait for a condition on the run page; past the time, fail saying where the run was."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(condition, timeout=minutes * MINUTE, polling=1000)
    except PlaywrightTimeout:
        raise AssertionError(
            f"after {minutes} min the run page still shows {summary(page)} "
            f"(not yet: {condition}); the launcher's last output:\n{product.tail()}"
        ) from None


def inspect_a_trajectory(page) -> None:
    page.click("#run-actions >> text=Trajectories")
    page.wait_for_url("**/trajectories/")
    assert page.input_value("#id_step") == str(DEMO_STEPS)  # the newest step first
    assert page.locator(".group").count() > 0
    page.locator(".group a.traj").first.click()
    page.wait_for_selector("#trajectory")
    trajectory = page.locator("#trajectory")
    question = trajectory.locator(".msg-user .content").first.inner_text()
    answer = trajectory.locator(".msg-assistant .content").last.inner_text()
    assert question.startswith("Write one sentence of at most "), question
    assert answer.strip() and "<|im_end|>" not in answer, answer
    assert re.fullmatch(r"\d\.\d{4}", trajectory.locator(".stat .value").first.inner_text().strip())  # its reward
    shot(page, "new-user-inspector")
    page.click("h1 a")  # back to the run
    page.wait_for_url(re.compile(r"/runs/\d+/(#.*)?$"))


def open_heatmap(page) -> None:
    page.click("#run-actions >> text=Heatmap")
    page.wait_for_url("**/heatmap/")
    page.wait_for_function("window.__artwebHeatmap && window.__artwebHeatmap.drawnAt !== null")
    assert re.search(rf"\d+ scenarios × {DEMO_STEPS} steps", page.inner_text("#heatmap-summary"))
    assert page.locator("#heatmap-empty").is_hidden()
    assert page.evaluate("document.getElementById('heatmap').data[0].type") == "heatmap"
    shot(page, "new-user-heatmap")


def ask_the_playground(page, run_id: int) -> None:
    """What the run trained, asked in the playground: an answer, without the end-of-turn token."""
    nav(page, "Playground")
    page.wait_for_url("**/playground/")
    model = f"run-{run_id}@best"
    page.select_option("#id_model_1", model)
    page.fill("#id_prompt", 'Write one sentence of at most 10 words about the sea. Use the word "blue".')
    page.click("#playground-form button[type=submit]")
    page.wait_for_url(re.compile(r"/playground/\d+/$"))
    page.wait_for_selector(".playground-column, #job-error", timeout=10 * MINUTE)
    shot(page, "new-user-playground")
    assert page.locator("#job-error").count() == 0, page.inner_text("#job-error")
    column = page.locator(".playground-column")
    assert column.count() == 1 and column.get_attribute("data-model") == model
    said = column.inner_text()
    assert column.locator(".errorlist").count() == 0, said
    answers = [a.inner_text() for a in column.locator(".answer .tokens").all()]
    assert len(answers) == 2 and all(a.strip() for a in answers), answers  # the form's default: 2 samples
    assert not any("<|im_end|>" in a for a in answers), answers


def dry_run_a_hanging_script(page) -> None:
    """A script whose rollout hangs, tried on one scenario: the page says what it waits for, then that
    the batch was stopped at its limit, and which rollout was still running, with what it printed."""
    nav(page, "Scripts")
    page.get_by_role("link", name="Upload a rollout script").click()
    page.fill("#id_name", "Weather agent")
    page.fill("#id_content", HANGING_SCRIPT)
    page.click("button[type=submit].primary")
    page.wait_for_url(re.compile(r"/scripts/\d+/$"))
    page.fill("#id_scenario_count", "1")
    page.fill("#id_samples", "1")
    page.click("button[type=submit]:has-text('Dry run')")
    page.wait_for_url(re.compile(r"/dry-runs/\d+/$"))
    page.locator("#dry-run-waiting:has-text('Rolling out 1 scenario x 1 against SmolLM2-135M-Instruct')").wait_for(
        timeout=5 * MINUTE
    )
    page.locator("#spread-verdict").wait_for(timeout=10 * MINUTE)  # the page reloads itself when it is done
    assert page.inner_text("#dry-run-status") == "done"
    verdict = page.inner_text("#spread-verdict")
    assert verdict.startswith(
        "The batch did not finish within its 90 s limit, so it was stopped with 1 rollout unfinished: scenario 0."
    ), verdict
    error = page.inner_text("pre.level-ERROR")
    assert "This one (scenario 0) was still running after" in error, error
    assert "waiting for the weather tool" in error and "cancelled; waiting on regardless" in error, error
    shot(page, "new-user-dry-run")


def register_a_bad_hub_id(page, product) -> None:
    nav(page, "Models")
    page.wait_for_url("**/models/")
    page.fill("#id_name", "my-model")
    page.fill("#id_source", BAD_HF_ID)
    page.click("button[type=submit]:has-text('Register')")
    page.locator("#id_source_errors").wait_for()
    said = page.inner_text("#id_source_errors")
    assert "not in this server's model cache" in said, said
    # ... and, on top, what to do about it: ask an administrator to download it, then register it again.
    errors = " ".join(e.inner_text() for e in page.locator(".errorlist, .alert-error").all())
    assert f"hf download {BAD_HF_ID}" in errors and "register it again" in errors, errors
    for path in (str(product.data_dir), str(ROOT), str(Path.home()), tempfile.gettempdir()):
        assert path not in errors, (path, errors)
    assert "my-model" not in page.inner_text("table")  # nothing was registered
    shot(page, "new-user-bad-hub-id")


def stop_with_ctrl_c(product) -> None:
    assert product.stop() == 0, product.tail()
    assert "artweb: stopping" in product.lines
    left = product.stop_leftovers()  # `make stop-services`: stops what a dead launcher left running
    assert "stopping embedded" not in left, left
    assert product.ports_in_use() == [], product.tail()
