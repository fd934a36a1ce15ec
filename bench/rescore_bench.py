"""Re-scoring throughput against the same reward function run inside a step's sandbox batch.

    python -m bench.rescore_bench                          # 20 steps x 4 groups x 8 trajectories
    python -m bench.rescore_bench --steps 20 --reward-ms 5 # a reward that burns 5 ms of CPU per call

Same machine, same reward (rollouts/examples/reward.py, optionally with --reward-ms of busy CPU added),
same trajectories, both jailed:

- in a step: each step's groups go through run_rollouts, the sandbox batch a step runs, with a rollout
  script that hands back the stored conversation at once (no inference). What remains of the batch is
  the reward part of a step: the jail and sandbox start, the reward calls and the result protocol, which
  is what a step pays for its reward beyond the rollouts themselves. Time is summed over the steps.
- re-scoring: rescore_execute over a run holding those trajectories, end to end: reading them from
  PostgreSQL, the jailed score batches (whole steps together), writing the scores and the summary.
  And, to separate the runtime from the batching, run_scores per step alone (one batch per step, as in
  a step).

Prints trajectories/s for each, the ratios, and the CPU model; writes bench/results/rescore.md.
Target: re-scoring >= 90% of in-step. Uses DATABASE_URL's server, database artweb_bench_rescore.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RESULTS = REPO / "bench" / "results" / "rescore.md"
WORDS = ["cat", "river", "lamp", "cloud", "stone", "bread", "garden", "violin"]

# The stored conversation comes back as the rollout's result: the batch does nothing but the reward.
REPLAY = """
import art, itertools

counters = {}

async def rollout(model, scenario):
    i = next(counters.setdefault(scenario["key"], itertools.count()))
    return art.Trajectory(messages_and_choices=list(scenario["replay"][i]))
"""

BURN = """

import time as _time

_example_reward = reward


def reward(trajectory, scenario):
    end = _time.process_time() + {seconds!r}
    while _time.process_time() < end:
        pass
    return _example_reward(trajectory, scenario)
"""


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown"


def reward_source(reward_ms: float) -> str:
    source = (REPO / "rollouts" / "examples" / "reward.py").read_text()
    return source + (BURN.format(seconds=reward_ms / 1000) if reward_ms > 0 else "")


def conversation(step: int, group: int, i: int) -> list[dict]:
    word = WORDS[(group + i) % len(WORDS)]
    length = 3 + (step * 7 + group * 3 + i * 5) % 14
    text = " ".join([word if i % 3 else "word"] + ["filler"] * length)
    return [
        {"role": "user", "content": f"Use the word {word} in at most 8 words."},
        {
            "role": "assistant",
            "content": text,
            "token_ids": [1] * length,
            "logprobs": [-0.5] * length,
            "finish_reason": "stop",
        },
    ]


def workload(steps: int, groups: int, size: int) -> list[list[tuple[dict, list[list[dict]]]]]:
    """Per step, its groups: (scenario, the group's conversations)."""
    return [
        [
            ({"word": WORDS[g % len(WORDS)], "max_words": 8}, [conversation(s, g, i) for i in range(size)])
            for g in range(groups)
        ]
        for s in range(1, steps + 1)
    ]


def in_step(work, reward: str, jail) -> float:
    """Seconds for every step's sandbox batch, reward attached, rollouts replayed."""
    from rollouts.sandbox.batch import SandboxLimits
    from rollouts.sandbox.rollouts import RolloutRequest, run_rollouts

    started = time.perf_counter()
    for step, groups in enumerate(work, start=1):
        scenarios = [{**scenario, "key": f"{step}-{g}", "replay": convs} for g, (scenario, convs) in enumerate(groups)]
        results = run_rollouts(
            RolloutRequest(
                script=REPLAY,
                reward=reward,
                scenarios=scenarios,
                group_size=len(groups[0][1]),
                base_url="http://127.0.0.1:9/v1",
                model_name="none",
                max_exceptions=0,
                jail=jail,
                limits=SandboxLimits(rollout_timeout_s=120.0),
                step=step,
            )
        )
        assert all(t["error"] is None for r in results for t in r.trajectories), results[0].errors
    return time.perf_counter() - started


def scores_per_step(work, reward: str, jail) -> float:
    """Seconds for run_scores, one batch per step (the step's batching, the re-scoring runtime)."""
    from rollouts.sandbox.batch import SandboxLimits
    from rollouts.sandbox.scores import ScoreGroup, ScoreRequest, run_scores

    started = time.perf_counter()
    for groups in work:
        results = run_scores(
            ScoreRequest(
                groups=[
                    ScoreGroup(
                        scenario=scenario,
                        trajectories=[{"messages": c, "tools": None, "metrics": {}, "metadata": {}} for c in convs],
                    )
                    for scenario, convs in groups
                ],
                reward=reward,
                jail=jail,
                limits=SandboxLimits(rollout_timeout_s=120.0),
            )
        )
        assert all(s["error"] is None for g in results for s in g), results[0]
    return time.perf_counter() - started


def setup_django(database_url: str) -> None:
    from bench.db import ensure_database

    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "artweb.settings")
    ensure_database(database_url)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def seed(work, reward: str):
    """A user, a finished run holding the workload's trajectories, and the reward as a new version."""
    import hashlib
    import uuid

    from django.contrib.auth import get_user_model

    from rollouts.models import (
        RewardFunction,
        RewardFunctionVersion,
        RolloutScript,
        RolloutScriptVersion,
        Scenario,
        ScenarioSet,
    )
    from training.models import PretrainedModel, Run, Trajectory, TrajectoryGroup

    tag = uuid.uuid4().hex[:8]
    user = get_user_model().objects.create_user(f"bench-{tag}")
    model, _ = PretrainedModel.objects.get_or_create(name="bench-rescore-model", defaults={"source": "bench/none"})
    script = RolloutScript.objects.create(owner=user, name=f"replay-{tag}")
    script_v = RolloutScriptVersion.objects.create(
        asset=script, number=1, content=REPLAY, sha256=hashlib.sha256(REPLAY.encode()).hexdigest()
    )
    asset = RewardFunction.objects.create(owner=user, name=f"reward-{tag}")
    reward_v = RewardFunctionVersion.objects.create(
        asset=asset, number=1, content=reward, kind="trajectory", sha256=hashlib.sha256(reward.encode()).hexdigest()
    )
    sset = ScenarioSet.objects.create(owner=user, name=f"set-{tag}", sha256="0" * 64, train_count=len(work[0]))
    scenarios = [
        Scenario.objects.create(scenario_set=sset, index=g, split="train", data=scenario)
        for g, (scenario, _) in enumerate(work[0])
    ]
    run = Run.objects.create(
        owner=user,
        name=f"bench-{tag}",
        base_model=model,
        script_version=script_v,
        reward_version=reward_v,
        scenario_set=sset,
        config={},
        num_steps=len(work),
        steps_done=len(work),
        status="completed",
    )
    for step, groups in enumerate(work, start=1):
        for g, (_, convs) in enumerate(groups):
            group = TrajectoryGroup.objects.create(run=run, step=step, scenario=scenarios[g])
            Trajectory.objects.bulk_create(
                [
                    Trajectory(group=group, run=run, step=step, index=i, messages=c, reward=0.5)
                    for i, c in enumerate(convs)
                ]
            )
    return user, run, reward_v


def rescore_service(user, run, reward_v) -> float:
    from training.analytics.rescores import rescore_create, rescore_execute
    from training.models import Rescore

    rescore = rescore_create(user=user, run=run, reward_version=reward_v)
    started = time.perf_counter()
    rescore_execute(rescore_id=rescore.id)
    elapsed = time.perf_counter() - started
    rescore.refresh_from_db()
    assert rescore.status == Rescore.Status.DONE and rescore.summary["errors"] == 0, rescore.error or rescore.summary
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--groups", type=int, default=4, help="groups per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--reward-ms", type=float, default=0.0, help="CPU milliseconds added to each reward call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()

    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/artweb")
    setup_django(args.database_url or urlparse(base)._replace(path="/artweb_bench_rescore").geturl())
    from training.services.inference import jail_config

    jail = jail_config()
    reward = reward_source(args.reward_ms)
    work = workload(args.steps, args.groups, args.group_size)
    n = args.steps * args.groups * args.group_size

    times = {"in_step": [], "scores_per_step": [], "rescore": []}
    for _ in range(args.repeats):
        times["in_step"].append(in_step(work, reward, jail))
        times["scores_per_step"].append(scores_per_step(work, reward, jail))
        user, run, reward_v = seed(work, reward)
        times["rescore"].append(rescore_service(user, run, reward_v))
    rate = {k: n / statistics.median(v) for k, v in times.items()}
    cpu = cpu_model()
    lines = [
        f"# Re-scoring throughput against the reward inside a step ({time.strftime('%Y-%m-%d')})",
        "",
        f"CPU: {cpu} ({os.cpu_count()} cores); sandbox {'jailed' if jail.jailed else 'NOT jailed'}; "
        f"{args.steps} steps x {args.groups} groups x {args.group_size} = {n} trajectories; "
        f"reward: rollouts/examples/reward.py"
        + (f" + {args.reward_ms:g} ms CPU per call" if args.reward_ms else "")
        + f"; median of {args.repeats}.",
        "",
        "| how | trajectories/s | seconds (median) | vs in-step |",
        "|---|---:|---:|---:|",
        (
            f"| in a step: run_rollouts per step, replayed rollouts + reward | {rate['in_step']:.1f} | "
            f"{statistics.median(times['in_step']):.2f} | 100% |"
        ),
        (
            f"| run_scores per step (re-scoring runtime, the step's batching) | {rate['scores_per_step']:.1f} | "
            f"{statistics.median(times['scores_per_step']):.2f} | {rate['scores_per_step'] / rate['in_step']:.0%} |"
        ),
        (
            f"| re-scoring: rescore_execute end to end (database included) | {rate['rescore']:.1f} | "
            f"{statistics.median(times['rescore']):.2f} | {rate['rescore'] / rate['in_step']:.0%} |"
        ),
        "",
        (
            f"Target: re-scoring >= 90% of in-step: {'met' if rate['rescore'] >= 0.9 * rate['in_step'] else 'NOT met'} "
            f"({rate['rescore'] / rate['in_step']:.0%})."
        ),
        "",
        (
            f"Command: `python -m bench.rescore_bench --steps {args.steps} --groups {args.groups} --group-size "
            f"{args.group_size} --reward-ms {args.reward_ms:g} --repeats {args.repeats}`"
        ),
    ]
    print("\n".join(lines))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    mode = "a" if RESULTS.exists() and os.environ.get("BENCH_APPEND") else "w"
    with open(RESULTS, mode) as fh:
        fh.write(("\n\n" if mode == "a" else "") + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
