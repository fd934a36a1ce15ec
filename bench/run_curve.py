"""Run the shipped example task through the real stack on this machine and print what a step costs.

Starts a Celery GPU worker (which starts the vLLM server), creates a run of the example task, waits for
it, then prints the mean reward per step (the learning curve), the held-out reward, and the wall time of
each phase of a step (median over steps). Uses the database and Redis the settings point at.

    python -m bench.run_curve --steps 20
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "artweb.settings")
django.setup()

import psutil
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Sum

from artweb.launcher.worker import gpu_worker_command, gpu_worker_env
from artweb.testing import stack
from rollouts.services import reward_create, scenario_set_create, script_create
from training.engine.default_model import ensure_default_model
from training.models import Run, Step, Trajectory
from training.services import base_model_register, run_create

EXAMPLES = Path(__file__).resolve().parents[1] / "rollouts" / "examples"
PHASES = ("rollouts", "persist", "trainer_load", "train", "checkpoint", "adapter_load", "validation", "step")


class PeakMemory:
    """Samples the resident memory of a process and all its descendants once a second; keeps the peak. A child
    still running its parent's program (a fork before its exec) shares its parent's pages and is not counted."""

    def __init__(self, pid: int):
        self.pid, self.peak_gb, self.peak_by_name = pid, 0.0, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self):
        while not self._stop.wait(1.0):
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
                seen = {}
                for p in procs:
                    try:
                        seen[p.pid] = (p, p.name(), p.cmdline(), p.ppid())
                    except psutil.Error:
                        continue
                rss = {}
                for pid, (p, name, cmdline, parent) in seen.items():
                    # A fork that has not exec'd yet (the sandbox's start) still runs its parent's command
                    # line and shares its pages copy-on-write: counting them again would double them.
                    if parent in seen and seen[parent][2] == cmdline:
                        continue
                    try:
                        rss[pid] = (name, p.memory_info().rss / 2**30)
                    except psutil.Error:
                        continue
            except psutil.Error:
                continue
            total = sum(gb for _, gb in rss.values())
            if total > self.peak_gb:
                self.peak_gb = total
                self.peak_by_name = {}
                for name, gb in rss.values():
                    self.peak_by_name[name] = self.peak_by_name.get(name, 0.0) + gb


def _register_model(model_dir: Path):
    """The default model as a base model; another checkout's copy registered under the plain name gets a
    name of its own here (names are unique and tied to one source)."""
    from training.models import PretrainedModel

    name = "SmolLM2-135M-Instruct"
    taken = PretrainedModel.objects.filter(name=name).exclude(source=str(model_dir)).exists()
    if taken:
        name = f"{name} ({hashlib.sha256(str(model_dir).encode()).hexdigest()[:8]})"
    return base_model_register(name=name, source=str(model_dir), local_path=str(model_dir), supports_tools=True)


def step_rows(run) -> list[dict]:
    """Each of a run's steps: reward, validation, wall time and phases, completion and trained tokens."""
    rows = []
    for s in Step.objects.filter(run=run).order_by("step"):
        completion = (
            Trajectory.objects.filter(group__run=run, group__step=s.step, group__split="train").aggregate(
                n=Sum("completion_tokens")
            )["n"]
            or 0
        )
        rows.append(
            {
                "step": s.step,
                "reward_mean": s.reward_mean,
                "val_reward": s.val_reward,
                "seconds": s.timings.get("step", s.duration_s),
                "ended_at": s.created_at.timestamp(),  # the step's record is written as it ends
                "timings": s.timings,
                "completion_tokens": completion,
                "tokens_trained": s.metrics.get("tokens_trained", 0),
                "micro_batch_tokens": s.metrics.get("micro_batch_tokens"),
                "micro_batches": s.metrics.get("micro_batches"),
                "out_of_memory_retries": s.metrics.get("out_of_memory_retries", 0),
            }
        )
    return rows


def run_artweb(
    *,
    steps: int,
    group_size: int,
    scenarios_per_step: int,
    max_tokens: int,
    learning_rate: float,
    val_every: int,
    val_scenarios: int = 8,
    timeout: float = 1800,
    seed: int = 0,
    overlap_rollouts: bool = False,
    script: Path = EXAMPLES / "rollout.py",
    reward: Path | None = EXAMPLES / "reward.py",
    scenarios: Path = EXAMPLES / "scenarios.jsonl",
) -> dict:
    """One run of a task (the example's by default; reward None: the script sets its own) on a fresh
    worker; its steps, phase timings and peak memory."""
    model_dir = ensure_default_model(Path(settings.DATA_DIR)).path.resolve()
    user, _ = get_user_model().objects.get_or_create(username="bench")
    tag = time.strftime("%Y%m%d-%H%M%S")
    model = _register_model(model_dir)
    config = {
        "num_steps": steps,
        "group_size": group_size,
        "scenarios_per_step": scenarios_per_step,
        "max_tokens": max_tokens,
        "val_every": val_every,
        "val_scenarios": val_scenarios,
        "seed": seed,
        "train": {"learning_rate": learning_rate},
        "overlap_rollouts": overlap_rollouts,
    }
    run = run_create(
        owner=user,
        name=f"curve-{tag}",
        base_model=model,
        script_version=script_create(owner=user, name=f"example-{tag}", content=script.read_text()),
        reward_version=reward_create(owner=user, name=f"example-{tag}", content=reward.read_text()) if reward else None,
        scenario_set=scenario_set_create(owner=user, name=f"example-{tag}", jsonl=scenarios.read_text()),
        config=config,
    )
    db_name = settings.DATABASES["default"]["NAME"]
    work = Path(tempfile.mkdtemp(prefix="artweb-curve-"))
    env = stack.stack_env(
        db_name=db_name,
        data_dir=work / "data",
        ARTWEB_VLLM_PORT=str(stack.free_port()),
        ARTWEB_VLLM_ENFORCE_EAGER=os.environ.get("ARTWEB_VLLM_ENFORCE_EAGER", "0"),
        ARTWEB_HEARTBEAT_SECONDS="15",
        # The server the worker picks for this processor, as under `make run` (the tests pin vLLM).
        ARTWEB_INFERENCE_ENGINE=os.environ.get("ARTWEB_INFERENCE_ENGINE", "auto"),
    )
    if "ARTWEB_VLLM_KV_CACHE_GB" not in os.environ:
        env.pop("ARTWEB_VLLM_KV_CACHE_GB", None)  # the server's KV cache as under `make run`, not the tests' size
    # Pool, threads and preloads as `make run` starts its GPU worker.
    worker = stack.start(
        "gpu-worker", gpu_worker_command(f"gpu-worker-{stack.free_port()}@%h"), gpu_worker_env(env), work / "logs"
    )
    started = time.time()
    try:
        with PeakMemory(worker.popen.pid) as memory:
            stack.wait_for(
                lambda: Run.objects.get(id=run.id).status in Run.FINAL_STATUSES,
                timeout=timeout,
                interval=2,
                procs=[worker],
                what="the run",
            )
    finally:
        worker.kill()
    run.refresh_from_db()
    rows = step_rows(run)
    last = run.checkpoints.order_by("-step").first()
    return {
        "run_id": run.id,
        "status": run.status,
        "error": run.error,
        "config": config,
        "steps": rows,
        "wall_seconds": time.time() - started,
        "peak_rss_gb": memory.peak_gb,
        "peak_rss_by_process_gb": memory.peak_by_name,
        "adapter": last.path if last else None,
        "worker_log": str(worker.log),
    }


def print_curve(result: dict) -> None:
    steps = result["steps"]
    print(
        f"run {result['run_id']} {result['status']} after {result['wall_seconds']:.0f}s wall ({len(steps)} steps); "
        f"config {result['config']}"
    )
    print("\nstep  reward_mean  val_reward  step_s")
    for s in steps:
        val = "" if s["val_reward"] is None else f"{s['val_reward']:10.3f}"
        reward = s["reward_mean"] if s["reward_mean"] is not None else float("nan")
        print(f"{s['step']:4d}  {reward:11.3f}  {val:>10}  {s['seconds']:6.1f}")
    if "peak_rss_gb" in result:  # a run this module started (bench.step_phases reads one it did not)
        by_process = sorted(result["peak_rss_by_process_gb"].items(), key=lambda kv: -kv[1])
        listed = ", ".join(f"{name} {gb:.2f}" for name, gb in by_process)
        print(f"peak resident memory of the worker's tree: {result['peak_rss_gb']:.2f} GiB ({listed})")
    if not steps:
        return
    rewards = [s["reward_mean"] for s in steps if s["reward_mean"] is not None]
    print(
        f"\nmean reward, first 3 steps: {statistics.fmean(rewards[:3]):.3f}; "
        f"last 3 steps: {statistics.fmean(rewards[-3:]):.3f}"
    )
    print("\nphase         median_s  share_of_step")
    step_med = statistics.median(s["timings"].get("step", 0.0) for s in steps)
    for phase in PHASES:
        values = [s["timings"][phase] for s in steps if phase in s["timings"]]
        if values:
            med = statistics.median(values)
            print(f"{phase:13s} {med:8.2f}  {med / step_med:6.1%}")
    other = [
        s["timings"]["step"]
        - s["timings"].get("rollouts", 0)
        - s["timings"].get("train", 0)
        - s["timings"].get("validation", 0)
        for s in steps
    ]
    print(
        f"outside rollouts+training (median): {statistics.median(other):.2f}s "
        f"= {statistics.median(other) / step_med:.1%} of a step"
    )
    plain = [s["timings"]["step"] for s in steps if "step" in s["timings"] and "validation" not in s["timings"]]
    if plain and len(plain) < len(steps):
        # A run from the form validates every few steps; the benchmark's never do: this is the figure to compare.
        print(f"step without validation (median of {len(plain)} steps): {statistics.median(plain):.2f}s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--group-size", type=int, default=6)
    parser.add_argument("--scenarios-per-step", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--val-every", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument(
        "--seed", type=int, default=0, help="the run's seed (its scenario sample and its adapter's start)"
    )
    parser.add_argument(
        "--overlap-rollouts",
        action="store_true",
        help="the run's overlap_rollouts (needs runtime adapters: ARTWEB_VLLM_ADAPTER_MODE=lora on a CPU)",
    )
    args = parser.parse_args()
    result = run_artweb(
        steps=args.steps,
        group_size=args.group_size,
        scenarios_per_step=args.scenarios_per_step,
        max_tokens=args.max_tokens,
        learning_rate=args.learning_rate,
        val_every=args.val_every,
        timeout=args.timeout,
        seed=args.seed,
        overlap_rollouts=args.overlap_rollouts,
    )
    print_curve(result)
    print(f"final adapter: {result['adapter']}")
    return 0 if result["status"] == Run.Status.COMPLETED else 1


if __name__ == "__main__":
    sys.exit(main())
