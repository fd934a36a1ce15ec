"""The views that say whether a run is learning, on a real run: the shipped example trained by a real GPU
worker (CTranslate2 server, jailed sandbox, PEFT trainer), the pages open in headless Chromium against the
ASGI server while it trains, then a re-score of the finished run by a real default-queue worker.

Each page must follow the run live (its WebSocket), not only show what was there when it loaded.
"""

from pathlib import Path

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from artweb.testing import stack
from tests.e2e.test_run_e2e import SMALL
from training.models import Rescore, Run, Step
from training.services import run_create

pytestmark = [pytest.mark.e2e, pytest.mark.browser]  # Playwright opens the pages itself

EXAMPLES = Path(__file__).resolve().parents[2] / "rollouts" / "examples"


@pytest.mark.inference_engine("ctranslate2")  # the views do not depend on the server; it starts in seconds
def test_the_heatmap_monitor_and_reward_health_follow_a_real_run_and_a_rescore_agrees(
    example_run_inputs, stack_env, procs, tmp_path, monkeypatch
):
    from playwright.sync_api import expect, sync_playwright

    from artweb.testing.web import CHROMIUM, CHROMIUM_ARGS

    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium")
    # Playwright's sync API keeps an event loop on this thread; the test's ORM calls are not async.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    web = stack.start_web(stack_env, tmp_path / "logs")
    procs.append(web)
    run = run_create(name="watched", config=SMALL, **example_run_inputs)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        context = browser.new_context(base_url=web.extra["url"], viewport={"width": 1400, "height": 1000})
        context.set_default_timeout(30_000)
        login = context.new_page()
        login.goto("/accounts/login/")
        login.fill("#id_username", "alice")
        login.fill("#id_password", "alice-pass-123")
        login.click("button[type=submit]")
        login.wait_for_url("**/")

        # Opened before the run has scored anything: all three must fill in as it trains.
        heatmap = context.new_page()
        heatmap.goto(f"/runs/{run.id}/heatmap/")
        heatmap.wait_for_function("window.__artwebHeatmap && window.__artwebHeatmap.state === 'open'")
        assert heatmap.locator("#heatmap-empty").is_visible()
        health = context.new_page()
        health.goto(f"/runs/{run.id}/health/")
        assert health.inner_text("#health-p50") == "—"
        monitor = context.new_page()
        monitor.goto(f"/runs/{run.id}/")
        monitor.wait_for_function("window.__artwebLive && window.__artwebLive.state === 'open'")

        procs.append(stack.start_gpu_worker(stack_env, tmp_path / "logs"))
        stack.wait_for(
            lambda: Run.objects.get(id=run.id).status in Run.FINAL_STATUSES,
            timeout=900,
            interval=2,
            procs=procs,
            what="the run to finish",
        )
        run.refresh_from_db()
        assert run.status == Run.Status.COMPLETED, (run.error, procs[-1].tail())

        # The heatmap: a row per scenario the run trained on, filled in live from the scored groups.
        trained = set(run.groups.filter(split="train").values_list("scenario__index", flat=True))
        heatmap.wait_for_function(
            f"document.getElementById('heatmap').data && "
            f"document.getElementById('heatmap').data[0].z.length === {len(trained)}"
        )
        assert heatmap.evaluate("window.__artwebHeatmap.live + window.__artwebHeatmap.draws") > 1
        assert not heatmap.locator("#heatmap-empty").is_visible()

        # Reward health: the example reward was timed on every trajectory, shown without a reload.
        health.wait_for_function(
            "document.getElementById('health-p50').textContent.endsWith('ms') || "
            "document.getElementById('health-p50').textContent.endsWith(' s')"
        )
        trajectories = run.trajectories.count()
        health.wait_for_function(f"document.getElementById('health-trajectories').textContent === '{trajectories}'")

        # The monitor: each step's signal figures drawn as the steps committed.
        monitor.locator("#chart-effective").scroll_into_view_if_needed()
        monitor.wait_for_function("document.getElementById('chart-effective').data[0].x.length === 3")
        expected = [Step.objects.get(run=run, step=s).metrics["effective_batch"] for s in (1, 2, 3)]
        assert monitor.evaluate("Array.from(document.getElementById('chart-effective').data[0].y)") == expected

        # A re-score of the finished run with the reward reweighted, by the default queue's worker.
        procs.append(stack.start_default_worker(stack_env, tmp_path / "logs"))
        reweighted = (
            (EXAMPLES / "reward.py")
            .read_text()
            .replace("return 0.5 * used_word + 0.5 * brevity", "return 0.8 * used_word + 0.2 * brevity")
        )
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=run.owner).key}")
        reward = api.post("/api/v1/rewards/create/", {"name": "reweighted", "content": reweighted}, format="json")
        assert reward.status_code == 201, reward.json()
        version = reward.json()["id"]
        started = api.post(f"/api/v1/runs/{run.id}/rescores/", {"reward_version": version}, format="json")
        assert started.status_code == 201, started.json()
        rescore_id = started.json()["id"]
        page = context.new_page()
        page.goto(f"/rescores/{rescore_id}/")
        stack.wait_for(
            lambda: Rescore.objects.get(id=rescore_id).status in ("done", "failed"),
            timeout=300,
            interval=1,
            procs=procs,
            what="the re-score",
        )
        rescore = Rescore.objects.get(id=rescore_id)
        assert rescore.status == "done", (rescore.error, procs[-1].tail())
        assert rescore.trajectories_done == run.trajectories.filter(group__split="train").count()
        assert rescore.summary["paired"] > 0 and -1 <= rescore.summary["spearman"] <= 1
        # The page followed the job and shows its figures (it reloads itself when the job is done).
        expect(page.locator("#agreement [data-figure=spearman]")).to_have_text(
            f"{rescore.summary['spearman']:.3f}", timeout=30_000
        )
        browser.close()
