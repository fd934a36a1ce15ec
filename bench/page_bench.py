"""Run page benchmark: load time and size with 2,000 steps and 100,000 trajectories, and the delay from
a metric's commit to its point on the chart in a real browser.

    python bench/page_bench.py [--loads 20] [--live 20]

Uses its own database (ARTWEB_BENCH_DATABASE_URL, default postgres://postgres@127.0.0.1:5432/artweb_bench,
created and migrated when missing), Redis at REDIS_URL, and Debian's Chromium (ARTWEB_CHROMIUM).
Targets: run page HTML + first chart data < 1 s p95 and < 500 kB; live point < 250 ms p95.
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BENCH_DB = os.environ.get("ARTWEB_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/artweb_bench")
os.environ["DATABASE_URL"] = BENCH_DB
os.environ["ARTWEB_CHANNEL_PREFIX"] = f"artweb-bench-{uuid.uuid4().hex[:8]}"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "artweb.settings")

STEPS = 2000
GROUPS_PER_STEP = 5
GROUP_SIZE = 10  # 2,000 × 5 × 10 = 100,000 trajectories


def ensure_database() -> None:
    from bench.db import ensure_database as create_if_missing

    create_if_missing(BENCH_DB)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def build_run():
    """A fresh run of STEPS steps and STEPS × GROUPS_PER_STEP × GROUP_SIZE trajectories (bulk inserts)."""
    import random

    from django.contrib.auth import get_user_model

    from rollouts.models import RolloutScript, RolloutScriptVersion, Scenario, ScenarioSet
    from training.models import Checkpoint, PretrainedModel, Run, RunEvent, RunLog, Step, Trajectory, TrajectoryGroup

    User = get_user_model()
    user, _ = User.objects.get_or_create(username="bench")
    Run.objects.filter(owner=user).delete()
    model, _ = PretrainedModel.objects.get_or_create(name="bench-model", defaults={"source": "org/bench-model"})
    script, _ = RolloutScript.objects.get_or_create(owner=user, name="bench-script")
    version, _ = RolloutScriptVersion.objects.get_or_create(
        asset=script, number=1, defaults={"content": "# bench", "sha256": "0" * 64}
    )
    scenario_set, created = ScenarioSet.objects.get_or_create(
        owner=user, name="bench-set", defaults={"sha256": "0" * 64, "train_count": 5}
    )
    if created:
        Scenario.objects.bulk_create(
            [
                Scenario(scenario_set=scenario_set, index=i, split="train", data={"prompt": f"task {i}"})
                for i in range(GROUPS_PER_STEP)
            ]
        )
    scenarios = list(scenario_set.scenarios.order_by("index"))
    run = Run.objects.create(
        owner=user,
        name="bench-run",
        base_model=model,
        script_version=version,
        scenario_set=scenario_set,
        config={"num_steps": STEPS * 2},
        num_steps=STEPS * 2,
        status="running",
        steps_done=STEPS,
        latest_reward=0.5,
    )
    rng = random.Random(0)
    Step.objects.bulk_create(
        [
            Step(
                run=run,
                step=s,
                reward_mean=min(1, s / STEPS + rng.gauss(0, 0.05)),
                reward_std=0.2,
                val_reward=(s / STEPS if s % 50 == 0 else None),
                duration_s=2.0 + rng.random(),
                timings={"step": 2.0},
                metrics={
                    "loss": rng.gauss(0.1, 0.02),
                    "kl": abs(rng.gauss(0.01, 0.005)),
                    "grad_norm": abs(rng.gauss(1, 0.3)),
                    "completion_tokens_mean": rng.uniform(30, 60),
                    "tokens_per_second": rng.uniform(800, 1200),
                },
            )
            for s in range(1, STEPS + 1)
        ],
        batch_size=1000,
    )
    groups = TrajectoryGroup.objects.bulk_create(
        [
            TrajectoryGroup(run=run, step=s, scenario=scenarios[g], reward_mean=0.5, reward_std=0.3)
            for s in range(1, STEPS + 1)
            for g in range(GROUPS_PER_STEP)
        ],
        batch_size=2000,
    )
    messages = [
        {"role": "system", "content": "You are a careful agent. " * 5},
        {"role": "user", "content": "Solve the task and answer briefly. " * 4},
        {
            "role": "assistant",
            "content": "Here is my answer. " * 8,
            "token_ids": list(range(48)),
            "logprobs": [-0.5] * 48,
        },
    ]
    batch = []
    for group in groups:
        for i in range(GROUP_SIZE):
            reward = float(rng.random() < 0.5)
            batch.append(
                Trajectory(
                    group=group,
                    run=run,
                    step=group.step,
                    index=i,
                    messages=messages,
                    reward=reward,
                    advantage=reward - 0.5,
                    prompt_tokens=60,
                    completion_tokens=48,
                    search_text="answer",
                )
            )
        if len(batch) >= 5000:
            Trajectory.objects.bulk_create(batch, batch_size=5000)
            batch = []
    Trajectory.objects.bulk_create(batch, batch_size=5000)
    RunEvent.objects.bulk_create([RunEvent(run=run, kind="status", message=f"event {i}") for i in range(300)])
    RunLog.objects.bulk_create([RunLog(run=run, step=s, message=f"step {s} done") for s in range(1, STEPS + 1)])
    Checkpoint.objects.bulk_create([Checkpoint(run=run, step=s, path=f"/nonexistent/{s}") for s in (STEPS - 1, STEPS)])
    return user, run


def session_cookie(user) -> str:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def measure_loads(base: str, cookie: str, run_id: int, n: int) -> dict:
    import httpx

    times, sizes = [], []
    with httpx.Client(base_url=base, cookies={"sessionid": cookie}, timeout=30) as http:
        http.get(f"/runs/{run_id}/")  # warm-up: connections, template cache
        for _ in range(n):
            t0 = time.perf_counter()
            r = http.get(f"/runs/{run_id}/")
            times.append(time.perf_counter() - t0)
            r.raise_for_status()
            sizes.append(len(r.content))
    body = r.content
    start = body.find(b'id="run-data"')
    data_bytes = len(body) - start if start > 0 else 0
    return {
        "times": times,
        "html_bytes": sizes[-1],
        "gzip_bytes": len(gzip.compress(body)),
        "chart_json_bytes": data_bytes,
    }


def measure_live(base: str, cookie: str, run, n: int) -> list[tuple[float, float]]:
    """(commit → drawn, commit → message received) per live step, in ms."""
    from django.db import connection, transaction
    from playwright.sync_api import sync_playwright

    from artweb.testing.web import CHROMIUM, CHROMIUM_ARGS
    from training.models import Run, Step
    from training.services.broadcast import run_broadcast

    def commit(step: int) -> float:
        """Persist and broadcast a step as the worker does; return the commit time (epoch ms)."""
        stamp = {}
        try:
            with transaction.atomic():
                Run.objects.filter(id=run.id).update(steps_done=step)
                Step.objects.create(
                    run=run,
                    step=step,
                    reward_mean=0.9,
                    reward_std=0.1,
                    metrics={"loss": 0.05, "kl": 0.01},
                    timings={"step": 2.0},
                    duration_s=2.0,
                )
                # Registered first, so it runs first among the on-commit callbacks: the commit time.
                transaction.on_commit(lambda: stamp.setdefault("t", time.time() * 1000))
                run_broadcast(
                    run.id,
                    {
                        "type": "step",
                        "run": run.id,
                        "step": step,
                        "steps_done": step,
                        "num_steps": run.num_steps,
                        "metrics": {"reward_mean": 0.9, "reward_std": 0.1, "loss": 0.05, "kl": 0.01, "duration_s": 2.0},
                    },
                    to_list=True,
                )
        finally:
            connection.close()
        return stamp["t"]

    latencies = []
    host = base.split("//", 1)[1].split(":")[0]
    with sync_playwright() as p, ThreadPoolExecutor(1) as worker:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        context = browser.new_context(base_url=base)
        context.add_cookies([{"name": "sessionid", "value": cookie, "domain": host, "path": "/"}])
        page = context.new_page()
        page.goto(f"/runs/{run.id}/")
        page.wait_for_function("window.__artwebLive && window.__artwebLive.state === 'open'", timeout=30_000)
        for i in range(n):
            step = STEPS + 1 + i
            committed = worker.submit(commit, step).result()
            page.wait_for_function(f"window.__artwebLive.points[{step}] !== undefined", timeout=10_000)
            received, drawn = page.evaluate(
                f"[window.__artwebLive.received[{step}], window.__artwebLive.points[{step}]]"
            )
            latencies.append((drawn - committed, received - committed))
            time.sleep(0.3)
        browser.close()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loads", type=int, default=20)
    parser.add_argument("--live", type=int, default=20)
    args = parser.parse_args()

    ensure_database()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    t0 = time.perf_counter()
    user, run = build_run()
    print(
        f"built run {run.id}: {STEPS} steps, {STEPS * GROUPS_PER_STEP * GROUP_SIZE} trajectories "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    cookie = session_cookie(user)

    from django.conf import settings

    from artweb.testing.web import AsgiServer

    server = AsgiServer(
        database_url=BENCH_DB,
        channel_prefix=settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"],
        broker_url="redis://127.0.0.1:6379/15",
    ).start()
    try:
        loads = measure_loads(server.url, cookie, run.id, args.loads)
        t = [x * 1000 for x in loads["times"]]
        print(
            f"run page load over HTTP ({args.loads} loads): p50 {pct(t, 0.5):.0f} ms, p95 {pct(t, 0.95):.0f} ms "
            f"(target < 1000 ms)"
        )
        print(
            f"run page size: {loads['html_bytes'] / 1000:.0f} kB HTML incl. {loads['chart_json_bytes'] / 1000:.0f} kB "
            f"first chart data (target < 500 kB); {loads['gzip_bytes'] / 1000:.0f} kB if gzipped"
        )
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's loop shares the main thread
        pairs = measure_live(server.url, cookie, run, args.live)
        live, socket = [p[0] for p in pairs], [p[1] for p in pairs]
        print(
            f"commit → point on chart ({args.live} steps): p50 {pct(live, 0.5):.0f} ms, p95 {pct(live, 0.95):.0f} ms, "
            f"max {max(live):.0f} ms (target p95 < 250 ms); mean {statistics.fmean(live):.0f} ms"
        )
        print(
            f"  of which commit → message in the browser: p50 {pct(socket, 0.5):.0f} ms, p95 {pct(socket, 0.95):.0f} ms"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
