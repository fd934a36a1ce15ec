"""Runs sharing one GPU worker: the aggregate steps per hour of four runs of four users queued together,
against one run alone on the same worker.

    python -m bench.sharing --steps 5 --out bench/results/sharing.md

One GPU worker process (as `make run` starts it) takes four phases in turn: a warm-up run of one step (the
inference server's start and the first imports, which no phase below should pay); one run of --steps
steps alone; then --runs runs of --steps steps each, of --runs users, created at once; then one run alone
again (the machine's load may change over the benchmark: the shared phase is compared with the mean of the
two alone). Steps per hour of a phase: its steps / (its last step's end - its runs' creation). Per run: its steps' mean wall time, and
when its steps ran (the queue's interleaving). Uses the database and Redis the settings point at.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "artweb.settings")
django.setup()

from django.conf import settings
from django.contrib.auth import get_user_model

from artweb.launcher.worker import gpu_worker_command, gpu_worker_env
from artweb.testing import stack
from bench.run_curve import _register_model
from bench.task import example_run
from training.engine.default_model import ensure_default_model
from training.models import Run, Step


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _launch(tag: str, users: list, model, steps: int, args) -> list[Run]:
    runs = []
    for i, user in enumerate(users):
        runs.append(
            example_run(
                user,
                f"share-{tag}-{i}",
                model,
                {
                    "num_steps": steps,
                    "group_size": args.group_size,
                    "scenarios_per_step": args.scenarios_per_step,
                    "max_tokens": args.max_tokens,
                    "val_every": 0,
                    "seed": i,
                    "train": {"learning_rate": 2e-4},
                },
            )
        )
    return runs


def _phase(tag: str, users: list, model, steps: int, args, worker) -> dict:
    started = time.time()
    runs = _launch(tag, users, model, steps, args)
    ids = [r.id for r in runs]
    stack.wait_for(
        lambda: all(s in Run.FINAL_STATUSES for s in Run.objects.filter(id__in=ids).values_list("status", flat=True)),
        timeout=args.timeout,
        interval=2,
        procs=[worker],
        what=f"the {tag} runs",
    )
    per_run = []
    ends = []
    for run in Run.objects.filter(id__in=ids).order_by("id"):
        rows = list(Step.objects.filter(run=run).order_by("step"))
        if run.status != Run.Status.COMPLETED:
            raise SystemExit(f"run {run.id} ended {run.status}: {run.error}")
        ends.extend(s.created_at.timestamp() for s in rows)
        per_run.append(
            {
                "run": run.id,
                "owner": run.owner.username,
                "steps": len(rows),
                "mean_step_s": statistics.fmean(s.timings.get("step", s.duration_s) for s in rows),
                "trainer_load_s": statistics.fmean(s.timings.get("trainer_load", 0.0) for s in rows[1:] or rows),
                "adapter_load_s": statistics.fmean(s.timings.get("adapter_load", 0.0) for s in rows),
                "done_after_s": max(s.created_at.timestamp() for s in rows) - started,
                "order": [round(s.created_at.timestamp() - started) for s in rows],
            }
        )
    wall = max(ends) - started
    total = sum(r["steps"] for r in per_run)
    return {"runs": per_run, "wall_s": wall, "steps": total, "steps_per_hour": total / wall * 3600}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5, help="steps of each run")
    parser.add_argument("--runs", type=int, default=4, help="runs sharing the worker in the second phase")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--scenarios-per-step", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--out", help="also write the report to this markdown file")
    args = parser.parse_args()

    model = _register_model(ensure_default_model(Path(settings.DATA_DIR)).path.resolve())
    # Users of this benchmark's own: the fair queue orders runs by their owners' recent GPU time, so the run alone
    # is another user's, and the shared runs' owners start even.
    tag = time.strftime("%H%M%S")
    alone_user = get_user_model().objects.create_user(f"bench-alone-{tag}")
    users = [get_user_model().objects.create_user(f"bench-share-{tag}-{i}") for i in range(args.runs)]
    work = Path(tempfile.mkdtemp(prefix="artweb-sharing-"))
    env = stack.stack_env(
        db_name=settings.DATABASES["default"]["NAME"],
        data_dir=work / "data",
        ARTWEB_VLLM_PORT=str(stack.free_port()),
        ARTWEB_HEARTBEAT_SECONDS="15",
        ARTWEB_INFERENCE_ENGINE=os.environ.get("ARTWEB_INFERENCE_ENGINE", "auto"),
    )
    env.pop("ARTWEB_VLLM_KV_CACHE_GB", None)  # the server's KV cache as under `make run`
    worker = stack.start(
        "gpu-worker", gpu_worker_command(f"gpu-worker-{stack.free_port()}@%h"), gpu_worker_env(env), work / "logs"
    )
    try:
        _phase("warm", [alone_user], model, 1, args, worker)
        alone = _phase("alone", [alone_user], model, args.steps, args, worker)
        shared = _phase("shared", users, model, args.steps, args, worker)
        after = _phase("alone-after", [alone_user], model, args.steps, args, worker)
    finally:
        worker.kill()
    device = f"CPU: {cpu_model()}, {os.cpu_count()} cores"
    text = report(args, [alone, after], shared, device)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


def report(args, alones: list[dict], shared: dict, device: str) -> str:
    alone_rate = statistics.fmean(a["steps_per_hour"] for a in alones)
    ratio = shared["steps_per_hour"] / alone_rate
    means = [r["mean_step_s"] for r in shared["runs"]]
    spread = (max(means) - min(means)) / statistics.fmean(means)
    lines = [
        f"# {args.runs} runs sharing one worker against one run alone ({time.strftime('%Y-%m-%d')})",
        "",
        f"- {device}; inference engine: {os.environ.get('ARTWEB_INFERENCE_ENGINE', 'auto')}.",
        f"- Command: `python -m bench.sharing --steps {args.steps} --runs {args.runs} --group-size {args.group_size} "
        f"--scenarios-per-step {args.scenarios_per_step} --max-tokens {args.max_tokens}`",
        "- Each run: the shipped example (rollouts/examples), no validation, its own user and seed.",
        "",
        "| phase | runs | steps | wall s | steps/hour |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {name} | 1 | {a['steps']} | {a['wall_s']:.1f} | {a['steps_per_hour']:.1f} |"
            for name, a in zip(("alone, before", "alone, after"), alones, strict=True)
        ),
        f"| shared | {len(shared['runs'])} | {shared['steps']} | {shared['wall_s']:.1f} | {shared['steps_per_hour']:.1f} |",
        "",
        "| run | owner | mean step s | trainer_load s (steps 2+) | adapter_load s | done after s | steps ended at s |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for phase, result in (("alone, before", alones[0]), ("shared", shared), ("alone, after", alones[1])):
        for r in result["runs"]:
            lines.append(
                f"| {phase} #{r['run']} | {r['owner']} | {r['mean_step_s']:.2f} | {r['trainer_load_s']:.2f} | "
                f"{r['adapter_load_s']:.2f} | {r['done_after_s']:.0f} | {', '.join(map(str, r['order']))} |"
            )
    lines += [
        "",
        f"Mean step time of the shared runs: {min(means):.2f}-{max(means):.2f} s, spread {spread:.0%} of their mean. "
        f"Steps/hour alone: {alone_rate:.1f} (mean of before and after).",
        "",
        f"aggregate steps/hour, {len(shared['runs'])} runs vs 1 ({device}): {ratio:.2f}x",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
