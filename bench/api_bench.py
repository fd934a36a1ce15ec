"""API latency benchmark: trajectory list pages and downsampled metrics with 100,000 trajectories and
2,000 steps in the database.

    python bench/api_bench.py [--requests 60] [--refill]

Uses its own database (ARTWEB_API_BENCH_DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/artweb_api_bench), created, migrated and filled when missing (the
fill is kept for the next run; --refill rebuilds it). Requests go through the whole Django stack
in-process (middleware, token authentication, DRF, serializers, JSON rendering); no network.
Targets: trajectory list page p95 < 100 ms; downsampled metrics of a 2,000-step run p95 < 100 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BENCH_DB = os.environ.get("ARTWEB_API_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/artweb_api_bench")
os.environ["DATABASE_URL"] = BENCH_DB
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "artweb.settings")

STEPS = 2000
GROUPS_PER_STEP = 10
GROUP_SIZE = 5  # 2,000 × 10 × 5 = 100,000 trajectories
TARGET_MS = 100.0


def ensure_database() -> None:
    from bench.db import ensure_database as create_if_missing

    create_if_missing(BENCH_DB)


def fill(refill: bool):
    """The bench user's run with STEPS steps and STEPS × GROUPS_PER_STEP × GROUP_SIZE trajectories."""
    import random

    from django.contrib.auth import get_user_model
    from django.db import transaction

    from rollouts.models import RolloutScript, RolloutScriptVersion, Scenario, ScenarioSet
    from training.models import PretrainedModel, Run, Step, Trajectory, TrajectoryGroup

    user, _ = get_user_model().objects.get_or_create(username="api-bench")
    run = Run.objects.filter(owner=user, name="api-bench-run").first()
    if run and not refill and Trajectory.objects.filter(run=run).count() == STEPS * GROUPS_PER_STEP * GROUP_SIZE:
        return user, run
    Run.objects.filter(owner=user).delete()
    model, _ = PretrainedModel.objects.get_or_create(name="api-bench-model", defaults={"source": "org/api-bench-model"})
    script, _ = RolloutScript.objects.get_or_create(owner=user, name="api-bench-script")
    version, _ = RolloutScriptVersion.objects.get_or_create(
        asset=script, number=1, defaults={"content": "# bench", "sha256": "0" * 64}
    )
    scenario_set, created = ScenarioSet.objects.get_or_create(
        owner=user, name="api-bench-set", defaults={"sha256": "0" * 64, "train_count": GROUPS_PER_STEP}
    )
    if created:
        Scenario.objects.bulk_create(
            [
                Scenario(
                    scenario_set=scenario_set,
                    index=i,
                    split="train",
                    data={"prompt": f"Task {i}: add {i} and {i + 1}."},
                )
                for i in range(GROUPS_PER_STEP)
            ]
        )
    scenarios = list(scenario_set.scenarios.order_by("index"))
    run = Run.objects.create(
        owner=user,
        name="api-bench-run",
        base_model=model,
        script_version=version,
        scenario_set=scenario_set,
        config={"num_steps": STEPS},
        num_steps=STEPS,
        status="completed",
        steps_done=STEPS,
    )
    rng = random.Random(0)
    started = time.perf_counter()
    Step.objects.bulk_create(
        [
            Step(
                run=run,
                step=s,
                reward_mean=rng.random(),
                reward_std=rng.random() / 4,
                val_reward=rng.random() if s % 10 == 0 else None,
                duration_s=rng.uniform(1, 3),
                metrics={
                    "loss": rng.gauss(0, 1),
                    "kl": rng.random() / 100,
                    "grad_norm": rng.uniform(0, 3),
                    "completion_tokens_mean": rng.uniform(10, 48),
                    "tokens_per_second": rng.uniform(100, 300),
                },
                timings={"rollouts": rng.uniform(0.5, 2), "train": rng.uniform(0.1, 0.5)},
            )
            for s in range(1, STEPS + 1)
        ],
        batch_size=1000,
    )
    for first in range(1, STEPS + 1, 200):
        with transaction.atomic():
            steps = range(first, min(first + 200, STEPS + 1))
            groups = TrajectoryGroup.objects.bulk_create(
                [
                    TrajectoryGroup(run=run, step=s, scenario=scenarios[g], reward_mean=0.5, reward_std=0.2)
                    for s in steps
                    for g in range(GROUPS_PER_STEP)
                ]
            )
            rows = []
            for group in groups:
                for i in range(GROUP_SIZE):
                    answer = f"The answer is {rng.randint(0, 99)}." + (" zebra" if rng.random() < 0.001 else "")
                    prompt = scenarios[0].data["prompt"]
                    rows.append(
                        Trajectory(
                            group=group,
                            run=run,
                            step=group.step,
                            index=i,
                            reward=rng.random(),
                            advantage=rng.gauss(0, 1),
                            prompt_tokens=40,
                            completion_tokens=12,
                            duration_ms=800,
                            messages=[
                                {"role": "system", "content": "You are a careful calculator. " * 4},
                                {"role": "user", "content": prompt},
                                {"role": "assistant", "content": answer},
                            ],
                            logs=["rollout started", "rollout finished"],
                            metrics={"correct": rng.random() < 0.5},
                            search_text=f"{prompt}\n{answer}",
                        )
                    )
            Trajectory.objects.bulk_create(rows, batch_size=5000)
        print(f"  filled steps {first}..{steps[-1]} ({time.perf_counter() - started:.0f} s)", flush=True)
    with __import__("django.db").db.connection.cursor() as cursor:
        cursor.execute("ANALYZE rollouts_trajectory; ANALYZE rollouts_trajectorygroup; ANALYZE training_step")
    return user, run


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def measure(client, url: str, n: int) -> list[float]:
    for _ in range(3):  # warm caches and connections
        assert client.get(url).status_code == 200, client.get(url).content[:300]
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - t0) * 1000)
        assert response.status_code == 200
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=60, help="Timed requests per endpoint.")
    parser.add_argument("--refill", action="store_true", help="Rebuild the data even if it is there.")
    args = parser.parse_args()

    ensure_database()
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    settings.ALLOWED_HOSTS = ["*"]
    call_command("migrate", verbosity=0)
    print(f"database {urlparse(BENCH_DB).path.lstrip('/')}: filling if needed ...", flush=True)
    user, run = fill(args.refill)

    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    from artweb.api import cursor_encode

    token, _ = Token.objects.get_or_create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    mid_group = run.groups.filter(step=STEPS // 2).order_by("id").first()
    deep_cursor = cursor_encode([STEPS // 2, mid_group.id, 2])
    base = f"/api/v1/runs/{run.id}"
    cases = [
        ("trajectories, first page (50)", f"{base}/trajectories/?limit=50", True),
        ("trajectories, page at step 1,000 (cursor)", f"{base}/trajectories/?limit=50&cursor={deep_cursor}", True),
        ("trajectories, step=1500", f"{base}/trajectories/?limit=50&step=1500", True),
        ("trajectories, min_reward=0.9", f"{base}/trajectories/?limit=50&min_reward=0.9", True),
        ("trajectories, text search (rare word)", f"{base}/trajectories/?limit=50&q=zebra", False),
        ("groups, first page (100)", f"{base}/groups/", False),
        ("metrics, default series, max_points=500", f"{base}/metrics/?max_points=500", True),
        ("metrics, reward_mean+loss, max_points=200", f"{base}/metrics/?series=reward_mean,loss&max_points=200", True),
        ("metrics, since step 1990 (poll)", f"{base}/metrics/?since_step=1990", False),
    ]
    from training.models import Step, Trajectory

    print(
        f"run {run.id}: {Step.objects.filter(run=run).count():,} steps, "
        f"{Trajectory.objects.filter(run=run).count():,} trajectories; {args.requests} requests each\n"
    )
    print(f"{'endpoint':<46} {'p50 ms':>8} {'p95 ms':>8} {'mean':>8}  target")
    failed = False
    for label, url, targeted in cases:
        times = measure(client, url, args.requests)
        p95 = pct(times, 0.95)
        verdict = ("ok" if p95 < TARGET_MS else "MISSED") if targeted else "-"
        failed |= targeted and p95 >= TARGET_MS
        print(f"{label:<46} {pct(times, 0.5):8.1f} {p95:8.1f} {statistics.mean(times):8.1f}  {verdict}")
    print(f"\ntargets (p95 < {TARGET_MS:.0f} ms on the marked rows): {'missed' if failed else 'met'}")


if __name__ == "__main__":
    main()
