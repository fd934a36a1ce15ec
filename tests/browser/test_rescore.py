"""Re-scoring from the browser: start a re-score on the run's page, a real Celery worker of the default queue
runs it in the jail, and the re-score's page follows it until it shows the agreement.

The shared browser server sends its Celery messages to a broker nobody reads; this module starts a server
of its own whose broker a default-queue worker (a separate process, as `make run` starts it) does read.
The run is seeded with stored trajectories (see tests/analytics/test_rescores.py).
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
import redis
from django.conf import settings

from artweb.testing.stack import default_worker_command_for_tests
from artweb.testing.web import ROOT, AsgiServer, database_url
from tests.analytics.test_rescores import new_reward, seed_group, seed_run
from tests.browser.conftest import ARTIFACTS, PASSWORD, shot

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]  # the stack below starts one


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, channel_prefix):
    """This module's web server and default-queue worker, on the test database and a broker of their own."""
    from django.db import connection

    broker = settings.CELERY_BROKER_URL
    redis.Redis.from_url(broker).delete("default")  # nothing left over from an earlier session
    with django_db_blocker.unblock():
        db_url = database_url(connection.settings_dict)
    server = AsgiServer(
        database_url=db_url, channel_prefix=channel_prefix, broker_url=broker, log_path=ARTIFACTS / "rescore-server.log"
    ).start()
    log = open(ARTIFACTS / "rescore-worker.log", "wb")
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "CELERY_BROKER_URL": broker,
        "DB_CONN_MAX_AGE": "0",
        "ARTWEB_SWEEP_SECONDS": "0",
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    }
    env = {k: v for k, v in env.items() if not k.startswith("PYTEST")}
    worker = subprocess.Popen(
        default_worker_command_for_tests(f"rescore-{os.getpid()}@%h"),
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    yield server
    worker.terminate()
    try:
        worker.wait(15)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
    log.close()
    server.stop()


@pytest.fixture
def alice_page(browser, stack, django_user_model):
    alice = django_user_model.objects.create_user("alice", "alice@example.com", PASSWORD)
    context = browser.new_context(base_url=stack.url, viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(15_000)
    page = context.new_page()
    page.console_errors = []
    page.on("console", lambda m: m.type == "error" and page.console_errors.append(m.text))
    page.on("pageerror", lambda e: page.console_errors.append(str(e)))
    page.goto("/accounts/login/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/")
    page.alice = alice
    yield page
    context.close()


def test_it_starts_a_rescore_from_the_page_and_shows_its_agreement(alice_page):
    page, alice = alice_page, alice_page.alice
    run = seed_run(alice, steps_done=2)
    seed_group(run, 1, [(0.0, "bb"), (1.0, "a"), (0.5, "ccc")])
    seed_group(run, 2, [(1.0, "dddd"), (0.0, "a"), (0.5, "bb")])
    version = new_reward(alice)

    page.goto(f"/runs/{run.id}/rescores/")
    page.get_by_text("No re-scores yet").wait_for()
    page.select_option("#id_scorer", f"v:{version.id}")
    page.click("#rescore-form button[type=submit]")
    page.wait_for_url("**/rescores/*/")
    started = time.monotonic()
    # The page polls while the worker scores, then shows the figures (the hand computation in the service test).
    page.locator("[data-figure=spearman]").wait_for(timeout=120_000)
    assert time.monotonic() - started < 120
    assert page.locator("[data-figure=spearman]").inner_text() == "0.308"
    assert page.locator("[data-figure=kendall_tau]").inner_text() == "0.320"
    assert page.locator("[data-figure=pair_agreement]").inner_text() == "0.667"
    assert page.locator("[data-figure=mean_abs_diff]").inner_text() == "1.667"
    assert page.locator("#rescore-count").inner_text() == "6 / 6 trajectories"
    # Both charts drawn by Plotly: the two curves by step, and six points old against new.
    page.locator("#rescore-curve .main-svg").first.wait_for()
    assert page.evaluate("document.getElementById('rescore-curve').data.length") == 2
    assert page.evaluate("document.getElementById('rescore-scatter').data[0].x.length") == 6
    # Disagreements first: the trajectory whose rank moved most (old 1.0, new 1.0: rank gap 4).
    first = page.locator("#scores tbody tr").first
    assert first.locator("td").nth(2).inner_text() == "1.000" and first.locator("td").nth(5).inner_text() == "4.0"
    shot(page, "rescore-detail")
    assert page.console_errors == []

    # Each row opens its trajectory in the inspector.
    first.locator("a").click()
    page.wait_for_url(f"**/runs/{run.id}/trajectories/**")
    assert "traj=" in page.url

    # The list shows it, and the ordering control works.
    page.goto(f"/runs/{run.id}/rescores/")
    assert page.locator("#rescores tbody tr").count() == 1
    assert "done" in page.locator("#rescores tbody tr").first.inner_text()


def test_a_refused_rescore_says_why_on_the_form(alice_page):
    page, alice = alice_page, alice_page.alice
    run = seed_run(alice, steps_done=0)
    version = new_reward(alice)
    page.goto(f"/runs/{run.id}/rescores/")
    page.select_option("#id_scorer", f"v:{version.id}")
    page.click("#rescore-form button[type=submit]")
    page.get_by_text("Nothing to re-score yet").wait_for()
    assert page.url.endswith(f"/runs/{run.id}/rescores/")
