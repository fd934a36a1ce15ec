"""Do the launch form's defaults learn? Launch the shipped example from the form N times with every
default untouched, train, and compare each run's held-out reward with the base model's.

What a new user does: the default model and the example task are loaded the way `make run` loads them
(fetch_default_model, seed_demo), the launch page is opened, only the run's name is typed in, and the
form is submitted as the page fills it in. One Celery GPU worker (started as the launcher starts it)
trains the runs one after another. Held-out reward is measured for the base model and each run's final
checkpoint by one evaluator (bench/heldout.py: every held-out scenario of the example, 16 answers each,
sampled at temperature 1 with one seed), so the runs are compared on equal terms.

    python -m bench.defaults_learn --runs 3 --out bench/results/defaults_learn.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "artweb.settings")
django.setup()

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.test.utils import setup_test_environment
from django.urls import reverse

from artweb.testing import stack
from bench.run_curve import PeakMemory
from training.models import Run, Step

REPO = Path(__file__).resolve().parents[1]


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def launch_with_defaults(client: Client, name: str) -> tuple[int, dict]:
    """Submit the launch form exactly as the page fills it in, with only the name typed; (run id, the
    values sent)."""
    page = client.get(reverse("run-launch"))
    assert page.status_code == 200, page.status_code
    form = page.context["form"]
    data = {}
    for field in form:
        value = field.value()
        choices = getattr(field.field, "choices", None)
        if value is None and choices is not None and field.field.required:
            value = next(str(v) for v, _ in choices if v != "")  # a browser shows the first option selected
        if isinstance(value, bool):
            if value:
                data[field.html_name] = "on"
        elif value is not None:
            data[field.html_name] = value
    data["name"] = name
    response = client.post(reverse("run-launch"), data)
    if response.status_code != 302:
        errors = response.context["form"].errors.as_json() if response.context else response.content[:500]
        raise SystemExit(f"the launch form refused its own defaults: {errors}")
    run_id = int(response.url.rstrip("/").split("/")[-1])
    return run_id, data


def heldout(model_dir: Path, adapters: dict[str, str], out: Path, samples: int = 16) -> dict:
    cmd = [sys.executable, "-m", "bench.heldout", "--model-dir", str(model_dir), "--out", str(out)]
    cmd += ["--samples", str(samples)]
    for name, path in adapters.items():
        cmd += ["--adapter", f"{name}={path}"]
    subprocess.run(cmd, check=True, cwd=REPO)
    return json.loads(out.read_text())["results"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds allowed per run")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "defaults_learn.md")
    args = parser.parse_args()

    call_command("fetch_default_model")
    user_model = get_user_model()
    user = user_model.objects.filter(username="defaults-bench").first() or user_model.objects.create_superuser(
        "defaults-bench", "defaults-bench@example.com", "unused-password"
    )
    call_command("seed_demo", owner=user.username)
    setup_test_environment()  # the client keeps the rendered page's form, as a test client does
    client = Client()
    client.force_login(user)

    tag = time.strftime("%Y%m%d-%H%M%S")
    launched = [launch_with_defaults(client, f"defaults {tag} #{i + 1}") for i in range(args.runs)]
    runs = [Run.objects.get(id=run_id) for run_id, _ in launched]
    sent = launched[0][1]
    print(f"launched runs {[r.id for r in runs]} with config {json.dumps(runs[0].config)}", flush=True)

    work = Path(tempfile.mkdtemp(prefix="artweb-defaults-"))
    env = stack.stack_env(
        db_name=settings.DATABASES["default"]["NAME"],
        data_dir=Path(settings.DATA_DIR),
        ARTWEB_VLLM_PORT=str(stack.free_port()),
        ARTWEB_VLLM_ENFORCE_EAGER=os.environ.get("ARTWEB_VLLM_ENFORCE_EAGER", "0"),
        ARTWEB_HEARTBEAT_SECONDS="15",
    )
    worker = stack.start_gpu_worker(env, work / "logs")
    started = time.time()
    try:
        with PeakMemory(worker.popen.pid) as memory:
            stack.wait_for(
                lambda: all(Run.objects.get(id=r.id).status in Run.FINAL_STATUSES for r in runs),
                timeout=args.timeout * len(runs),
                interval=5,
                procs=[worker],
                what="the runs",
            )
    finally:
        worker.kill()
    wall = time.time() - started

    adapters, rows = {}, []
    for run in runs:
        run.refresh_from_db()
        last = run.checkpoints.filter(step=run.num_steps).first()
        if run.status != Run.Status.COMPLETED or last is None:
            raise SystemExit(f"run {run.id} ended {run.status} without its last checkpoint: {run.error}")
        adapters[f"run{run.id}"] = last.path
        steps = list(Step.objects.filter(run=run).order_by("step"))
        rows.append(
            {
                "run": run.id,
                "train_first3": statistics.fmean(s.reward_mean for s in steps[:3]),
                "train_last3": statistics.fmean(s.reward_mean for s in steps[-3:]),
                "val": {s.step: s.val_reward for s in steps if s.val_reward is not None},
                "step_s": statistics.median(s.duration_s for s in steps),
            }
        )
    results = heldout(Path(runs[0].base_model.local_path), adapters, work / "heldout.json")
    base = results["base"]["reward_mean"]
    gains = [results[f"run{r['run']}"]["reward_mean"] - base for r in rows]

    cfg = runs[0].config
    lines = [
        f"# The launch form's defaults on the shipped example ({time.strftime('%Y-%m-%d')})",
        "",
        f"- Machine: {_cpu()}, {os.cpu_count()} cores; Python {platform.python_version()}; no GPU.",
        f"- Command: `python -m bench.defaults_learn --runs {args.runs}`",
        f"- Form values sent (only the name typed): {json.dumps({k: v for k, v in sent.items() if k != 'name'})}",
        f"- Stored run config: {json.dumps(cfg)}",
        f"- Wall time for {args.runs} runs on one worker: {wall / 60:.1f} min; peak resident memory of the "
        f"worker tree {memory.peak_gb:.1f} GiB.",
        f"- Held-out reward: {results['base']['answers']} answers (every held-out scenario of the example x 16, "
        "temperature 1, one seed), scored by the example reward; base model and each run's step-"
        f"{cfg['num_steps']} checkpoint through the same evaluator.",
        "",
        "| run | train reward, steps 1-3 | train reward, last 3 steps | in-run validation by step | median step s | held-out after | change vs base |",
        "|---:|---:|---:|---|---:|---:|---:|",
    ]
    for row, gain in zip(rows, gains, strict=False):
        val = ", ".join(f"{k}: {v:.3f}" for k, v in row["val"].items())
        lines.append(
            f"| {row['run']} | {row['train_first3']:.3f} | {row['train_last3']:.3f} | {val} | "
            f"{row['step_s']:.1f} | {results['run' + str(row['run'])]['reward_mean']:.3f} | {gain:+.3f} |"
        )
    spread = statistics.pstdev(gains) if len(gains) > 1 else 0.0
    lines += [
        "",
        f"Base model held-out reward: {base:.3f}. Change after {cfg['num_steps']} steps: mean "
        f"{statistics.fmean(gains):+.3f}, min {min(gains):+.3f}, max {max(gains):+.3f}, "
        f"standard deviation {spread:.3f} over {len(gains)} runs.",
    ]
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)
    return 0 if min(gains) > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
