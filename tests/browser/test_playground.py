"""The playground and the answer diff pages in Chromium, on the whole path: the page's form queues a job,
a real default-queue Celery worker (this module's, as in test_rescore.py) generates through the serving
thread (in this process, on the session's real vLLM server) and scores the answers in the jail; the page
follows the job and shows the answers side by side."""

from __future__ import annotations

import csv
import io
import time
from decimal import ROUND_HALF_UP, Decimal

import pytest

from artweb.testing.serving import make_served_run
from rollouts.services import reward_create, scenario_set_create
from tests.browser import test_rescore
from tests.browser.conftest import shot
from tests.e2e import serving
from training.serving.models import ServeJob


def floatformat3(value: float) -> str:
    """What the page's `floatformat:3` shows: rounded half up (Python's format rounds 0.0625 to even, 0.062)."""
    return str(Decimal(repr(value)).quantize(Decimal("0.001"), rounding=ROUND_HALF_UP))


# This module's own web server and default-queue worker, and alice signed in there (see test_rescore.py);
# the serving thread on the session's vLLM server (tests/e2e/serving.py).
stack = test_rescore.stack
alice_page = test_rescore.alice_page
serving_worker = serving.serving_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.timeout(900)]

LENGTH_REWARD = """
def reward(trajectory, scenario) -> float:
    answer = trajectory.messages()[-1]["content"] or ""
    return min(1.0, len(answer) / 40)
"""
# For the diff: answers of 16 tokens score below 1, so the scenarios' changes differ and their order shows.
SPREAD_REWARD = LENGTH_REWARD.replace("/ 40", "/ 200")
TOOLS = '[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]'


def test_the_playground_answers_with_two_models_side_by_side(alice_page, serving_worker, vllm_model_dir, tmp_path):
    page, alice = alice_page, alice_page.alice
    model, run, _ = make_served_run(alice, vllm_model_dir, tmp_path / "step1")
    serving_worker(model)
    version = reward_create(owner=alice, name="length", content=LENGTH_REWARD)

    page.goto("/playground/")
    page.fill("#id_prompt", "Say something about the sea.")
    page.select_option("#id_model_1", model.name)
    page.select_option("#id_model_2", f"run-{run.id}@1")
    page.fill("#id_samples", "2")
    page.fill("#id_max_tokens", "12")
    page.select_option("#id_reward", str(version.id))
    page.click("#playground-form button[type=submit]")
    page.wait_for_url("**/playground/*/")
    started = time.monotonic()
    page.locator(".playground-column").first.wait_for(timeout=300_000)
    job = ServeJob.objects.get(owner=alice, kind="playground")
    assert job.status == "done", job.error
    columns = page.locator(".playground-column")
    assert columns.count() == 2
    assert [columns.nth(i).get_attribute("data-model") for i in range(2)] == [model.name, f"run-{run.id}@1"]
    for i in range(2):
        assert columns.nth(i).locator(".answer").count() == 2
        assert columns.nth(i).locator(".badge.reward").count() == 2
    # The rewards shown are the jail's scores of the stored answers.
    first = job.result["columns"][0]["answers"][0]
    assert columns.nth(0).locator(".badge.reward").first.inner_text() == f"reward {floatformat3(first['reward'])}"
    # A token's log-probability and the other candidates show on hover.
    token = columns.nth(0).locator(".tok").first
    token.hover()
    tip = page.locator("#logprob-tip")
    tip.wait_for(state="visible")
    assert "logprob" in tip.inner_text() and f"{first['tokens'][0]['logprob']:.3f}" in tip.inner_text()
    assert len(tip.inner_text().splitlines()) == 1 + len(first["tokens"][0]["top"])
    shot(page, "playground")
    assert time.monotonic() - started < 300

    # Tools: the model must call one; the call is shown with its arguments.
    page.fill("#id_prompt", "What is the weather in Paris?")
    page.select_option("#id_model_2", "")
    page.fill("#id_samples", "1")
    page.fill("#id_max_tokens", "128")
    page.fill("#id_temperature", "0")
    page.fill("#id_tools", TOOLS)
    page.fill("#id_tool_choice", "get_weather")
    page.select_option("#id_reward", "")
    page.click("#playground-form button[type=submit]")
    page.locator(".tool-call").first.wait_for(timeout=300_000)
    assert "get_weather" in page.locator(".tool-call").first.inner_text()
    assert page.console_errors == []


def test_the_playground_says_what_to_fix(alice_page):
    page = alice_page
    page.goto("/playground/")
    page.fill("#id_tools", "[not json")
    page.click("#playground-form button[type=submit]")
    page.locator("#id_tools_errors").wait_for()
    assert "Not JSON" in page.locator("#id_tools_errors").inner_text()


def test_an_answer_diff_from_the_page_shows_the_biggest_changes_first(
    alice_page, serving_worker, vllm_model_dir, tmp_path
):
    page, alice = alice_page, alice_page.alice
    model, run, _ = make_served_run(alice, vllm_model_dir, tmp_path / "step1")
    serving_worker(model)
    version = reward_create(owner=alice, name="length", content=SPREAD_REWARD)
    lines = "\n".join(f'{{"prompt": "Write about {w}."}}' for w in ("rain", "snow", "wind", "sun", "fog", "ice"))
    held = scenario_set_create(owner=alice, name="weather", jsonl=lines, validation_fraction=0.5)

    page.goto("/diffs/")
    page.get_by_text("No diffs yet").wait_for()
    page.select_option("#id_model_a", model.name)
    page.select_option("#id_model_b", f"run-{run.id}@latest")
    page.select_option("#id_scenario_set", str(held.id))
    page.select_option("#id_reward", str(version.id))
    page.fill("#id_samples", "2")
    page.fill("#id_max_tokens", "16")
    page.click("#diff-form button[type=submit]")
    page.wait_for_url("**/diffs/*/")
    page.locator("#diff-summary").wait_for(timeout=300_000)
    job = ServeJob.objects.get(owner=alice, kind="diff")
    rows = page.locator(".diff-row")
    assert rows.count() == held.validation_count == 3
    deltas = [abs(float(rows.nth(i).get_attribute("data-delta"))) for i in range(rows.count())]
    assert deltas == sorted(deltas, reverse=True) and len(set(deltas)) > 1
    stored = {r.index: r for r in job.diff_scenarios.all()}
    top = stored[int(rows.nth(0).get_attribute("data-index"))]
    assert rows.nth(0).locator(".side-a .answer").count() == 2 and rows.nth(0).locator(".side-b .answer").count() == 2
    assert rows.nth(0).locator(".side-b .tokens").first.inner_text() == top.answers_b[0]["content"].strip()
    assert page.locator("#mean-delta").inner_text() == floatformat3(job.result["mean_delta"])
    # Exports: the CSV has a line per scenario, in the page's order.
    csv_text = page.evaluate("url => fetch(url).then(r => r.text())", page.locator("#export-csv").get_attribute("href"))
    indexes = [int(line["index"]) for line in csv.DictReader(io.StringIO(csv_text))]
    assert indexes == [int(rows.nth(i).get_attribute("data-index")) for i in range(rows.count())]
    shot(page, "diff-detail")
    page.goto("/diffs/")
    assert page.locator("#diffs tbody tr").count() == 1
    assert page.console_errors == []
