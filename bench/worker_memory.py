"""Does the GPU worker's resident memory stay flat over a long run? One run of the shipped example with
the launch defaults, on a worker started as the launcher starts it (prefork), sampling the resident memory
of the worker's process tree (the worker, its pool child, the vLLM server) after every step.

    python -m bench.worker_memory --steps 50

Prints the memory after each step and the ratio of step N's to step 5's (target: within 15 %). A sample is
taken as soon as a step is recorded, while the next step starts, so single samples swing with the phase
the worker is in; the medians of five steps around step 5 and of the last five are printed as well.
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

import psutil
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command

from artweb.testing import stack
from bench.defaults_learn import _cpu
from rollouts.models import RewardFunctionVersion, RolloutScriptVersion, ScenarioSet
from training.models import PretrainedModel, Run
from training.services import run_create


def tree_rss_gb(pid: int) -> dict[str, float]:
    root = psutil.Process(pid)
    out: dict[str, float] = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            name = "vllm" if "--served-model-name" in proc.cmdline() else ("worker" if proc.pid == pid else proc.name())
            out[name] = out.get(name, 0.0) + proc.memory_info().rss / 2**30
        except psutil.Error:
            continue
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()

    call_command("fetch_default_model")
    users = get_user_model().objects
    user = users.filter(username="memory-bench").first() or users.create_superuser(
        "memory-bench", "memory-bench@example.com", "unused-password"
    )
    call_command("seed_demo", owner=user.username)
    run = run_create(
        owner=user,
        name=f"memory {time.strftime('%H%M%S')}",
        base_model=PretrainedModel.objects.get(name="SmolLM2-135M-Instruct"),
        script_version=RolloutScriptVersion.objects.filter(asset__owner=user).latest("id"),
        reward_version=RewardFunctionVersion.objects.filter(asset__owner=user).latest("id"),
        scenario_set=ScenarioSet.objects.filter(owner=user).latest("id"),
        config={"num_steps": args.steps, "val_every": 0},
    )
    work = Path(tempfile.mkdtemp(prefix="artweb-memory-"))
    env = stack.stack_env(
        db_name=settings.DATABASES["default"]["NAME"],
        data_dir=Path(settings.DATA_DIR),
        ARTWEB_VLLM_PORT=str(stack.free_port()),
        ARTWEB_VLLM_ENFORCE_EAGER="0",
        ARTWEB_HEARTBEAT_SECONDS="15",
    )
    worker = stack.start_gpu_worker(env, work / "logs", name="memory", pool="prefork")
    samples: dict[int, dict[str, float]] = {}
    try:
        seen = 0
        deadline = time.time() + 60 * args.steps + 600
        while time.time() < deadline:
            run.refresh_from_db()
            if run.steps_done > seen:
                seen = run.steps_done
                samples[seen] = tree_rss_gb(worker.popen.pid)
                parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(samples[seen].items()))
                print(f"step {seen:3d}: {sum(samples[seen].values()):.2f} GiB ({parts})", flush=True)
            if run.status in Run.FINAL_STATUSES:
                break
            time.sleep(0.5)
    finally:
        worker.kill()
    if run.status != Run.Status.COMPLETED:
        print(f"run ended {run.status}: {run.error}\n{worker.tail()}")
        return 1
    total = {k: sum(v.values()) for k, v in samples.items()}
    early = statistics.median(total[k] for k in range(3, 8) if k in total)
    late = statistics.median(total[k] for k in range(args.steps - 4, args.steps + 1) if k in total)
    print(f"\n{_cpu()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(
        f"worker tree resident memory: step 5 {total[5]:.2f} GiB, step {args.steps} {total[args.steps]:.2f} GiB, "
        f"ratio {total[args.steps] / total[5]:.3f} (peak {max(total.values()):.2f} GiB at step "
        f"{max(total, key=total.get)})"
    )
    print(
        f"medians: steps 3-7 {early:.2f} GiB, steps {args.steps - 4}-{args.steps} {late:.2f} GiB, ratio {late / early:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
