"""A run watched from before its start to its end without a reload, on its page and in the runs list, in a
real browser against the ASGI server: every chart and every field follows it live, and a reload at the
end shows exactly what the live pages showed.

No worker runs here: the test calls the services a worker calls (run_transition to start and to finish
the run, step_commit for each step with its figures, checkpoint and validation reward; retention
deletes checkpoints in it) and the one the API calls to promote a checkpoint, each in a thread of its
own as a worker would. Their messages leave on commit through the real Redis channel layer and
consumers, and the pages' own scripts draw them.
"""

from __future__ import annotations

import pytest
from django.utils import timezone

from artweb.testing.factories import RunFactory
from tests.browser.conftest import shot
from tests.browser.test_dashboard import as_worker, assert_no_console_errors
from training.charts import RUN_CHARTS
from training.models import Checkpoint, Run
from training.services import run_transition
from training.services.checkpoints import checkpoint_promote
from training.services.steps.commit import step_commit

pytestmark = pytest.mark.timeout(180)

STEPS = 4
VALIDATIONS = {2: 0.61, 4: 0.683}  # step -> its validation reward
SIGNAL_CHARTS = [c["id"] for c in RUN_CHARTS if c.get("signal")]
CHART_IDS = [c["id"] for c in RUN_CHARTS]

# Per chart: its raw trace's points, its mode, and whether it still says "no data yet".
CHARTS_JS = """(ids) => Object.fromEntries(ids.map((id) => {
  const el = document.getElementById(`chart-${id}`);
  const raw = (el.data || []).find((t) => t.name === "raw") || { x: [], y: [] };
  const empty = (el.layout.annotations || []).some((a) => a.text === "no data yet");
  return [id, { x: [...raw.x], y: [...raw.y], mode: raw.mode, empty }];
}))"""


def figures(step: int) -> tuple[dict, dict, dict]:
    """(stats, metrics, timings) of a step as the step loop gives step_commit: rewards, the update's
    figures, the learning signals, the phase times."""
    stats = {"reward_mean": round(0.2 * step, 3), "reward_std": 0.1}
    metrics = {
        **stats,
        "loss": 0.5 / step,
        "kl": 0.01 * step,
        "grad_norm": 1.0 + step,
        "completion_tokens_mean": 40.0 + step,
        "tokens_per_second": 900.0 + 10 * step,
        "dead_group_share": 0.25 / step,
        "effective_batch": 6 + step,
        "advantage_std": 0.9,
        "sampler_kl": 0.002 * step,
        "truncation_rate": 0.1,
        "entropy": 1.5 - 0.1 * step,
    }
    timings = {"rollouts": 1.0, "train": 0.5, "step": 2.0 + step}
    return stats, metrics, timings


def commit(run: Run, step: int, tmp_path) -> None:
    """The end of a step, as the step loop does it: the step's record, its checkpoint and validation."""
    stats, metrics, timings = figures(step)
    val = VALIDATIONS.get(step)
    if val is not None:
        metrics["val_reward"] = val
    ckpt = tmp_path / f"step-{step}"
    ckpt.mkdir()
    (ckpt / "adapter_model.safetensors").write_bytes(b"0" * 64)
    run = Run.objects.get(id=run.id)
    as_worker(step_commit, run, step, stats, val, metrics, timings, ckpt, {"size_bytes": 2048 * step})


def expected_points(step: int) -> dict[str, int]:
    return {cid: len([s for s in VALIDATIONS if s <= step]) if cid == "val" else step for cid in CHART_IDS}


def charts(page) -> dict:
    return page.evaluate(CHARTS_JS, CHART_IDS)


def wait_for_points(page, counts: dict[str, int]) -> dict:
    """Every chart's raw trace holds its count of points (a chart out of view draws them when idle)."""
    page.wait_for_function(
        """([ids, counts]) => ids.every((id) => {
          const raw = (document.getElementById(`chart-${id}`).data || []).find((t) => t.name === "raw");
          return raw && raw.x.length === counts[id];
        })""",
        arg=[CHART_IDS, counts],
    )
    return charts(page)


def text(page, selector: str) -> str:
    return page.locator(selector).inner_text().strip()


def summary(page) -> dict:
    """Every field of the run page besides its charts, as a person reads it."""
    return {
        "status": text(page, "#run-status"),
        "steps": text(page, "#run-steps"),
        "latest": text(page, "#run-latest"),
        "best": text(page, "#run-best"),
        "started": text(page, "#run-started"),
        "eta": text(page, "#run-eta"),
        "tab": page.locator("#tab-checkpoints").text_content().strip(),
        "error_shown": page.locator("#run-error").is_visible(),
        "checkpoints": page.evaluate(
            """() => [...document.querySelectorAll('#checkpoint-rows tr[data-checkpoint]')].map((tr) =>
                 [...tr.cells].map((td) => td.textContent.trim()).concat(tr.querySelector('a[download]') ? 'download' : ''))"""
        ),
    }


def row(list_page, run: Run) -> dict:
    """The run's row in the runs list, cell by cell."""
    tr = list_page.locator(f"tr[data-run='{run.id}']")
    return {
        "status": tr.locator("[data-status]").inner_text().strip(),
        "steps": tr.locator("[data-steps]").inner_text().strip(),
        "latest": tr.locator("[data-latest]").inner_text().strip(),
        "best": tr.locator("[data-best]").inner_text().strip(),
        "started": tr.locator("[data-started]").inner_text().strip(),
    }


def wall_clock(moment) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M")


def test_a_run_is_followed_from_queued_to_completed_without_a_reload(signed_in, user, tmp_path):
    page = signed_in
    run = RunFactory(owner=user, name="watched", num_steps=STEPS, status=Run.Status.QUEUED)
    list_page = page.context.new_page()
    list_page.console_errors = []
    list_page.on("console", lambda m: m.type == "error" and list_page.console_errors.append(m.text))
    list_page.on("pageerror", lambda e: list_page.console_errors.append(str(e)))
    list_page.goto("/")
    list_page.wait_for_selector("#live-state[data-state=open]")
    page.goto(f"/runs/{run.id}/")
    page.wait_for_function("window.__artwebLive && window.__artwebLive.state === 'open'")

    # Before the start: nothing to show, and every chart says so.
    assert summary(page) == {
        "status": "queued",
        "steps": f"0 / {STEPS}",
        "latest": "—",
        "best": "—",
        "started": "—",
        "eta": "—",
        "tab": "Checkpoints (0)",
        "error_shown": False,
        "checkpoints": [],
    }
    assert all(c["x"] == [] and c["empty"] for c in charts(page).values())
    assert row(list_page, run) == {
        "status": "queued",
        "steps": f"0/{STEPS}",
        "latest": "—",
        "best": "—",
        "started": "not yet",
    }

    # A worker picks it up: starting, then running, which stamps its start.
    as_worker(run_transition, run=run, from_statuses=(Run.Status.QUEUED,), to_status=Run.Status.STARTING)
    as_worker(run_transition, run=run, from_statuses=(Run.Status.STARTING,), to_status=Run.Status.RUNNING)
    run.refresh_from_db()
    started = wall_clock(run.started_at)
    page.locator("#run-status:has-text('running')").wait_for()
    page.locator(f"#run-started:has-text('{started}')").wait_for()
    list_page.locator(f"tr[data-run='{run.id}'] [data-started]:has-text('{started}')").wait_for()
    assert row(list_page, run)["status"] == "running"

    best = "—"
    for step in range(1, STEPS + 1):
        commit(run, step, tmp_path)
        shown = wait_for_points(page, expected_points(step))
        best = f"{VALIDATIONS[step]:.3f}" if step in VALIDATIONS else best
        page.locator(f"#tab-checkpoints:has-text('Checkpoints ({step})')").wait_for()
        page.locator(f"#run-best:has-text('{best}')").wait_for()
        fields = summary(page)
        assert fields["steps"] == f"{step} / {STEPS}"
        assert fields["latest"] == f"{figures(step)[0]['reward_mean']:.3f}"
        assert fields["started"] == started and fields["eta"] != "—"
        assert [r[0].split()[0] for r in fields["checkpoints"]] == [str(s) for s in range(step, 0, -1)]

        # Each chart has the step's point, with the step's value (step time: the step's wall clock).
        _, metrics, timings = figures(step)
        for spec in RUN_CHARTS:
            chart = shown[spec["id"]]
            assert len(chart["x"]) == expected_points(step)[spec["id"]], spec["id"]
            assert not chart["empty"] or spec["id"] == "val" and step < 2, spec["id"]
            if spec["id"] == "val":
                continue
            value = timings["step"] if spec["series"] == "duration_s" else metrics[spec["series"]]
            assert chart["x"][-1] == step and chart["y"][-1] == pytest.approx(value, abs=1e-6), spec["id"]
            # One point alone is a marker (a line of one point draws nothing); from two on, a line.
            assert ("markers" in chart["mode"]) == (len(chart["x"]) == 1 or bool(spec.get("markers"))), spec["id"]
        list_page.locator(f"tr[data-run='{run.id}'] [data-steps]:has-text('{step}/{STEPS}')").wait_for()
        list_page.locator(f"tr[data-run='{run.id}'] [data-best]:has-text('{best}')").wait_for()
        assert row(list_page, run)["latest"] == fields["latest"]
        if step == 1:
            shot(page, "run-page-live-first-step")

    # Retention kept the newest two and the best: steps 1 and 2 are deleted, their rows say so live.
    # (The Checkpoints tab is hidden while the Charts tab is open: its rows are there all the same.)
    page.locator("#checkpoint-rows tr[data-step='2'] td:nth-child(2):has-text('deleted')").wait_for(state="attached")
    states = {r[0]: (r[1], r[-1]) for r in summary(page)["checkpoints"]}
    assert states == {
        "4": ("active", "download"),
        "3": ("active", "download"),
        "2": ("deleted", ""),
        "1": ("deleted", ""),
    }
    assert [c.state for c in Checkpoint.objects.filter(run=run).order_by("-step")] == [
        "active",
        "active",
        "deleted",
        "deleted",
    ]

    # The run completes: its status, and no time left.
    as_worker(run_transition, run=run, from_statuses=Run.ACTIVE_STATUSES, to_status=Run.Status.COMPLETED, worker="")
    page.locator("#run-status:has-text('completed')").wait_for()
    page.locator("#run-eta:has-text('—')").wait_for()
    list_page.locator(f"tr[data-run='{run.id}'] [data-status]:has-text('completed')").wait_for()

    # Someone promotes step 3's checkpoint (the API's service): the badge shows on its row.
    as_worker(checkpoint_promote, checkpoint=Checkpoint.objects.get(run=run, step=3), actor=user)
    page.locator("#checkpoint-rows tr[data-step='3'] [data-promoted]").wait_for(state="attached")

    page.click("#tab-checkpoints")
    shot(page, "run-page-live-checkpoints")
    page.click("#tab-charts")
    live = {"summary": summary(page), "charts": charts(page)}
    live_row = row(list_page, run)
    assert live["summary"]["tab"] == f"Checkpoints ({STEPS})" and live["summary"]["best"] == "0.683"
    assert live_row == {
        "status": "completed",
        "steps": f"{STEPS}/{STEPS}",
        "latest": f"{figures(STEPS)[0]['reward_mean']:.3f}",
        "best": "0.683",
        "started": started,
    }
    assert_no_console_errors(page)
    assert_no_console_errors(list_page)

    # A reload builds the pages from the database: the very same figures, the same points.
    page.reload()
    page.wait_for_function("window.__artwebLive && window.__artwebLive.state === 'open'")
    assert summary(page) == live["summary"]
    reloaded = wait_for_points(page, expected_points(STEPS))
    assert {k: (c["x"], c["y"], c["empty"]) for k, c in reloaded.items()} == {
        k: (c["x"], c["y"], c["empty"]) for k, c in live["charts"].items()
    }
    list_page.reload()
    list_page.wait_for_selector("#live-state[data-state=open]")
    assert row(list_page, run) == live_row
    assert_no_console_errors(page)


def test_a_chart_of_one_point_shows_it(signed_in, user, tmp_path):
    """A finished run of one step, opened after the fact: each chart's single point is a marker."""
    page = signed_in
    run = RunFactory(owner=user, name="one step", num_steps=1, status=Run.Status.RUNNING)
    commit(run, 1, tmp_path)
    page.goto(f"/runs/{run.id}/")
    shown = wait_for_points(page, {cid: 0 if cid == "val" else 1 for cid in CHART_IDS})
    for cid, chart in shown.items():
        if cid != "val":
            assert "markers" in chart["mode"] and not chart["empty"], cid
    assert_no_console_errors(page)
