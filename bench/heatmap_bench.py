"""Heatmap page benchmark: 1,000 scenarios × 2,000 steps, first paint and bytes in headless Chromium.

    python bench/heatmap_bench.py [--loads 10] [--groups-per-step 50] [--dense]

--groups-per-step 50 is a run sampling 50 of its 1,000 scenarios per step (100,000 groups); --dense gives
every scenario a group at every step (2,000,000 groups, the worst case). Uses its own database
(ARTWEB_HEATMAP_BENCH_DATABASE_URL, default postgres://postgres@127.0.0.1:5432/artweb_heatmap_bench, created
and migrated when missing), Redis at REDIS_URL, and Debian's Chromium (ARTWEB_CHROMIUM).

First paint: from navigation start to the heatmap drawn (Plotly's promise resolved), in a browser that
has the page's assets cached (plotly.js is served with a one-year immutable cache), then once cold.
Bytes: what the browser received up to that moment (Resource Timing's transferSize: gzip as served,
headers included). Targets: first paint < 1 s, < 500 kB transferred. Writes bench/results/heatmap.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BENCH_DB = os.environ.get(
    "ARTWEB_HEATMAP_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/artweb_heatmap_bench"
)
os.environ["DATABASE_URL"] = BENCH_DB
os.environ["ARTWEB_CHANNEL_PREFIX"] = f"artweb-bench-{uuid.uuid4().hex[:8]}"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "artweb.settings")

SCENARIOS = 1000
STEPS = 2000
RESULTS = ROOT / "bench" / "results" / "heatmap.md"

# Everything the browser received until the heatmap was drawn, by kind.
TRANSFER_JS = """() => {
  const drawn = window.__artwebHeatmap.previewAt ?? window.__artwebHeatmap.drawnAt;
  const nav = performance.getEntriesByType("navigation")[0];
  const out = {document: nav.transferSize, documentBody: nav.encodedBodySize, other: 0, requests: 1,
               htmlDone: nav.responseEnd, started: window.__artwebHeatmap.startedAt,
               decoded: window.__artwebHeatmap.decodedAt, dcl: nav.domContentLoadedEventStart};
  for (const e of performance.getEntriesByType("resource")) {
    if (e.responseEnd > drawn) continue;
    out.other += e.transferSize;
    out.requests += 1;
  }
  return out;
}"""


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        name = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
        return f"{name}, {os.cpu_count()} cores"
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown CPU"


def build_run(groups_per_step: int):
    """A run of STEPS steps over SCENARIOS scenarios, groups_per_step scored groups per step (bulk inserts)."""
    import random

    from django.contrib.auth import get_user_model
    from django.db import connection

    from rollouts.models import RolloutScript, RolloutScriptVersion, Scenario, ScenarioSet
    from training.models import PretrainedModel, Run

    User = get_user_model()
    user, _ = User.objects.get_or_create(username="bench")
    Run.objects.filter(owner=user).delete()
    model, _ = PretrainedModel.objects.get_or_create(name="bench-model", defaults={"source": "org/bench-model"})
    script, _ = RolloutScript.objects.get_or_create(owner=user, name="bench-script")
    version, _ = RolloutScriptVersion.objects.get_or_create(
        asset=script, number=1, defaults={"content": "# bench", "sha256": "0" * 64}
    )
    scenario_set, created = ScenarioSet.objects.get_or_create(
        owner=user, name="heatmap-bench-set", defaults={"sha256": "0" * 64, "train_count": SCENARIOS}
    )
    if created:
        Scenario.objects.bulk_create(
            [
                Scenario(
                    scenario_set=scenario_set,
                    index=i,
                    split="train",
                    data={
                        "prompt": f"Find the shortest route between stop {i} and stop {i + 7} "
                        "on the city map, avoiding closed roads.",
                        "answer": str(i),
                    },
                )
                for i in range(SCENARIOS)
            ]
        )
    scenario_ids = list(scenario_set.scenarios.order_by("index").values_list("id", flat=True))
    run = Run.objects.create(
        owner=user,
        name="heatmap-bench",
        base_model=model,
        script_version=version,
        scenario_set=scenario_set,
        config={"num_steps": STEPS},
        num_steps=STEPS,
        status="completed",
        steps_done=STEPS,
    )
    # Rows written by COPY: 2,000,000 ORM objects would take longer than the benchmark.
    rng = random.Random(0)
    skill = [rng.random() for _ in scenario_ids]  # each scenario learns at its own pace
    with (
        connection.cursor() as cursor,
        cursor.copy(
            "COPY rollouts_trajectorygroup (run_id, step, split, scenario_id, reward_mean, reward_std, error_count,"
            " skipped, failed_attempt, created_at) FROM STDIN"
        ) as copy,
    ):
        now = time.strftime("%Y-%m-%d %H:%M:%S+00", time.gmtime())
        for step in range(1, STEPS + 1):
            picked = range(SCENARIOS) if groups_per_step >= SCENARIOS else rng.sample(range(SCENARIOS), groups_per_step)
            for i in picked:
                p = min(1.0, skill[i] * step / STEPS * 2)
                reward = round(sum(rng.random() < p for _ in range(8)) / 8, 4)
                copy.write_row((run.id, step, "train", scenario_ids[i], reward, 0.3, 0, False, False, now))
    # As the run's step commits would have: each step's heatmap column, from its groups.
    from training.analytics.heatmap import heatmap_columns_record

    for step in range(1, STEPS + 1):
        heatmap_columns_record(run_id=run.id, step=step)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE rollouts_trajectorygroup")
        cursor.execute("ANALYZE training_heatmapcolumn")
    return user, run


def session_cookie(user) -> str:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def measure(base: str, cookie: str, run_id: int, loads: int) -> dict:
    from playwright.sync_api import sync_playwright

    from artweb.testing.web import CHROMIUM, CHROMIUM_ARGS

    host = base.split("//", 1)[1].split(":")[0]
    url = f"/runs/{run_id}/heatmap/"
    # First paint: the cells on screen (the preview image); interactive: the Plotly chart has replaced it.
    drawn = "window.__artwebHeatmap && window.__artwebHeatmap.drawnAt !== null"
    paint = "(window.__artwebHeatmap.previewAt ?? window.__artwebHeatmap.drawnAt)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)

        def context():
            ctx = browser.new_context(base_url=base, viewport={"width": 1400, "height": 1000})
            ctx.add_cookies([{"name": "sessionid", "value": cookie, "domain": host, "path": "/"}])
            return ctx

        cold_ctx = context()
        page = cold_ctx.new_page()
        page.goto(url)
        page.wait_for_function(drawn, timeout=60_000)
        cold = {
            "paint": page.evaluate(paint),
            "interactive": page.evaluate("window.__artwebHeatmap.drawnAt"),
            **page.evaluate(TRANSFER_JS),
        }
        info = page.evaluate("""() => { const d = document.getElementById('heatmap').data[0];
                                         return {rows: d.z.length, cols: d.x.length}; }""")
        page.close()

        paints, interactive, transfers, html, started = [], [], [], [], []
        for _ in range(loads):  # same context: plotly.js and the static files are cached, as on any return visit
            page = cold_ctx.new_page()
            page.goto(url)
            page.wait_for_function(drawn, timeout=60_000)
            paints.append(page.evaluate(paint))
            interactive.append(page.evaluate("window.__artwebHeatmap.drawnAt"))
            transfers.append(page.evaluate(TRANSFER_JS))
            html.append(transfers[-1]["htmlDone"])
            started.append(transfers[-1]["started"])
            page.close()
        browser.close()
    return {
        "cold": cold,
        "paints": paints,
        "interactive": interactive,
        "transfers": transfers,
        "html": html,
        "started": started,
        **info,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loads", type=int, default=10)
    parser.add_argument("--groups-per-step", type=int, default=50)
    parser.add_argument("--dense", action="store_true", help="every scenario at every step (2,000,000 groups)")
    args = parser.parse_args()
    per_step = SCENARIOS if args.dense else args.groups_per_step

    from bench.db import ensure_database

    ensure_database(BENCH_DB)
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from artweb.testing.web import AsgiServer

    call_command("migrate", verbosity=0)
    t0 = time.perf_counter()
    user, run = build_run(per_step)
    groups = STEPS * per_step
    print(
        f"built run {run.id}: {SCENARIOS} scenarios × {STEPS} steps, {groups:,} groups "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    cookie = session_cookie(user)
    server = AsgiServer(
        database_url=BENCH_DB,
        channel_prefix=settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"],
        broker_url="redis://127.0.0.1:6379/15",
    ).start()
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's loop shares the main thread
    try:
        m = measure(server.url, cookie, run.id, args.loads)
    finally:
        server.stop()

    paints = m["paints"]
    warm = m["transfers"][-1]
    warm_kb = (warm["document"] + warm["other"]) / 1000
    cold_kb = (m["cold"]["document"] + m["cold"]["other"]) / 1000
    lines = [
        (
            f"heatmap page, {SCENARIOS} scenarios × {STEPS} steps, {groups:,} groups "
            f"({'dense' if per_step >= SCENARIOS else f'{per_step} per step'}); "
            f"drawn {m['rows']} rows × {m['cols']} columns"
        ),
        f"CPU: {cpu_model()}; load average over the last minute {os.getloadavg()[0]:.1f} at the end (other work slows it)",
        (
            f"first paint, navigation start → every cell on screen ({args.loads} loads, assets cached): "
            f"p50 {pct(paints, 0.5):.0f} ms, p95 {pct(paints, 0.95):.0f} ms, max {max(paints):.0f} ms (target < 1000 ms); "
            f"by then (p50): the page's HTML received {pct(m['html'], 0.5):.0f} ms, the page's script started "
            f"{pct(m['started'], 0.5):.0f} ms"
        ),
        (
            f"interactive (plotly.js loaded after the first paint, the chart with hover and click replacing the "
            f"image): p50 {pct(m['interactive'], 0.5):.0f} ms, p95 {pct(m['interactive'], 0.95):.0f} ms"
        ),
        (
            f"transferred until the first paint, assets cached: {warm_kb:.0f} kB in {warm['requests']} requests, of which the "
            f"page {warm['document'] / 1000:.0f} kB (gzip, headers included) (target < 500 kB)"
        ),
        (
            f"first visit ever (nothing cached): first paint {m['cold']['paint']:.0f} ms with {cold_kb:.0f} kB in "
            f"{m['cold']['requests']} requests; plotly.js (about 1.5 MB gzip, then cached for a year) loads after it, "
            f"interactive at {m['cold']['interactive']:.0f} ms"
        ),
    ]
    for line in lines:
        print(line)
    write_results("dense" if per_step >= SCENARIOS else f"{per_step} groups per step", lines, args)


def write_results(mode: str, lines: list[str], args) -> None:
    """bench/results/heatmap.md: one section per mode, this run's replacing the last one of its mode."""
    sections: dict[str, str] = {}
    if RESULTS.exists():
        for chunk in RESULTS.read_text().split("\n## ")[1:]:
            title, _, body = chunk.partition("\n")
            sections[title.strip()] = body.strip()
    command = "python bench/heatmap_bench.py" + (
        " --dense" if args.dense else f" --groups-per-step {args.groups_per_step}"
    )
    sections[mode] = f"`{command} --loads {args.loads}` ({time.strftime('%Y-%m-%d')})\n\n" + "\n".join(
        f"- {line}" for line in lines
    )
    RESULTS.write_text(
        "# Heatmap page benchmark\n\nWritten by `bench/heatmap_bench.py`; the last run of each mode.\n"
        + "".join(f"\n## {title}\n\n{body}\n" for title, body in sections.items())
    )


if __name__ == "__main__":
    main()
