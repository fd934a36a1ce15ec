"""A client-driven run against an uploaded-script run of the same task, on this machine: what a step costs
each way and whether they learn alike.

For each seed: the shipped example as an uploaded run (bench.run_curve: rollouts in the jail), then the
same task driven by ART's client from PyPI (bench/art_client_example.py through ServerlessBackend:
rollouts in the client through the OpenAI endpoint, updates on the worker). Both use the same worker
command, scenarios per step (the same ones for a seed), group size, tokens, learning rate, held-out set.

A client step's cost is its rollouts (timed in the client) plus its training job from post to commit (the
job's rows): the client's 1-second poll for the job's events is left out, as the target says. Prints the
median step of each, their ratio, and the held-out reward after the last step per seed with the mean and
standard error over seeds.

Both runs' last checkpoints are then scored by one evaluator (bench.heldout: every held-out scenario of
the example, --heldout-samples answers each, one sampler and seed for all), so the comparison does not
depend on who sampled the validation answers: the in-run figures (the worker's validation for the script,
8 answers sampled by the client for the client) are printed too, but the verdict is the evaluator's, the
script - client difference paired over scenarios per seed, with its standard error over seeds.

    python -m bench.client_run --steps 20 --seeds 2
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
from rest_framework.authtoken.models import Token

from artweb.launcher.worker import gpu_worker_command, gpu_worker_env
from artweb.testing import stack
from artweb.testing.art_client import art_python
from bench.defaults_learn import heldout
from bench.run_curve import EXAMPLES, _register_model, run_artweb
from bench.trl_compare import heldout_difference
from training.client_runs.models import ClientModel, ClientTrainingJob
from training.client_runs.services import client_model_register
from training.engine.default_model import ensure_default_model
from training.models import Run

ART_VERSION = "0.5.18"


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def run_client(*, seed: int, steps: int, args) -> dict:
    """The example task driven by ART's client; its per-step cost and held-out rewards."""
    model_dir = ensure_default_model(Path(settings.DATA_DIR)).path.resolve()
    base = _register_model(model_dir)
    user, _ = get_user_model().objects.get_or_create(username="bench")
    token, _ = Token.objects.get_or_create(user=user)
    work = Path(tempfile.mkdtemp(prefix="artweb-client-run-"))
    env = stack.stack_env(
        db_name=settings.DATABASES["default"]["NAME"],
        data_dir=work / "data",
        ARTWEB_VLLM_PORT=str(stack.free_port()),
        ARTWEB_VLLM_ENFORCE_EAGER=os.environ.get("ARTWEB_VLLM_ENFORCE_EAGER", "0"),
        ARTWEB_HEARTBEAT_SECONDS="15",
        ARTWEB_INFERENCE_ENGINE=os.environ.get("ARTWEB_INFERENCE_ENGINE", "auto"),
    )
    if "ARTWEB_VLLM_KV_CACHE_GB" not in os.environ:
        env.pop("ARTWEB_VLLM_KV_CACHE_GB", None)
    worker = stack.start(
        "gpu-worker", gpu_worker_command(f"gpu-worker-{stack.free_port()}@%h"), gpu_worker_env(env), work / "logs"
    )
    web = stack.start_web(env, work / "logs")
    name = f"example-{seed}-{time.strftime('%H%M%S')}"
    # Registered here first (the client's register() then finds it) to give the run the seed the uploaded
    # run has: ART sends none, and the seed also starts the adapter's initialisation.
    found = client_model_register(
        user=user, entity=None, project="bench-client", name=name, base_model=base.name, return_existing=True
    )
    Run.objects.filter(id=found.run_id).update(config={**found.run.config, "seed": seed})
    command = [
        str(art_python(ART_VERSION)),
        str(Path(__file__).with_name("art_client_example.py")),
        str(EXAMPLES),
        *("--steps", str(steps), "--seed", str(seed), "--base-model", base.name, "--name", name),
        *("--group-size", str(args.group_size), "--scenarios-per-step", str(args.scenarios_per_step)),
        *("--max-tokens", str(args.max_tokens), "--learning-rate", str(args.learning_rate)),
        *("--val-every", str(args.val_every)),
    ]
    client_env = {**os.environ, "ARTWEB_TOKEN": token.key, "ARTWEB_ART_URL": web.extra["url"] + "/api/v1/art"}
    started = time.time()
    try:
        done = subprocess.run(command, env=client_env, capture_output=True, text=True, timeout=args.timeout)
    finally:
        worker.kill()
        web.kill()
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0:
        raise RuntimeError(f"the ART client failed ({done.returncode}):\n{done.stderr[-4000:]}\n{worker.tail()}")
    run = ClientModel.objects.get(owner=user, project="bench-client", name=name).run
    jobs = {j.step: j for j in ClientTrainingJob.objects.filter(run=run, status="done")}
    for line in lines:
        job = jobs[line["step"]]
        line["job_s"] = (job.finished_at - job.created_at).total_seconds()
        line["step_s"] = line["rollouts_s"] + line["job_s"]
    last = run.checkpoints.order_by("-step").first()
    return {
        "run_id": run.id,
        "steps": lines,
        "wall_seconds": time.time() - started,
        "checkpoint": last.path if last else None,
    }


def last_checkpoint(run_id: int) -> str:
    run = Run.objects.get(id=run_id)
    last = run.checkpoints.filter(step=run.steps_done).first()
    if last is None:
        raise SystemExit(f"run {run_id} ended {run.status} without the checkpoint of its last step: {run.error}")
    return last.path


def summary(script: dict, client: dict) -> dict:
    """Median step each way (the script run's steps without validation, the client's without its own held-out
    rollouts), and the held-out reward of each run's last step."""
    script_steps = [s["seconds"] for s in script["steps"] if "validation" not in s["timings"]]
    client_steps = [s["step_s"] for s in client["steps"]]
    held = lambda rows: next((r["val_reward"] for r in reversed(rows) if r.get("val_reward") is not None), None)  # noqa: E731
    return {
        "script_step_s": statistics.median(script_steps),
        "client_step_s": statistics.median(client_steps),
        "client_rollouts_s": statistics.median(s["rollouts_s"] for s in client["steps"]),
        "client_job_s": statistics.median(s["job_s"] for s in client["steps"]),
        "script_rollouts_s": statistics.median(s["timings"]["rollouts"] for s in script["steps"]),
        "script_held_out": held(script["steps"]),
        "client_held_out": held(client["steps"]),
    }


def _mean_se(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f} (one seed: no standard error)"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values) / len(values) ** 0.5:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    parser.add_argument("--group-size", type=int, default=6)
    parser.add_argument("--scenarios-per-step", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--val-every", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--heldout-samples", type=int, default=16, help="the evaluator's answers per scenario")
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; ART client {ART_VERSION}; {vars(args)}", flush=True)
    rows, adapters = [], {}
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    for seed in seeds:
        script = run_artweb(
            steps=args.steps,
            group_size=args.group_size,
            scenarios_per_step=args.scenarios_per_step,
            max_tokens=args.max_tokens,
            learning_rate=args.learning_rate,
            val_every=args.val_every,
            seed=seed,
            timeout=args.timeout,
        )
        client = run_client(seed=seed, steps=args.steps, args=args)
        row = {"seed": seed, **summary(script, client)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        adapters[f"script-{seed}"] = last_checkpoint(script["run_id"])
        adapters[f"client-{seed}"] = last_checkpoint(client["run_id"])
    script_s = statistics.median(r["script_step_s"] for r in rows)
    client_s = statistics.median(r["client_step_s"] for r in rows)
    print(f"\nmedian step: uploaded script {script_s:.2f}s, ART client {client_s:.2f}s (rollouts + job, poll aside)")
    print(f"in-run validation after {args.steps} steps, mean ± standard error over {len(rows)} seeds:")
    print(f"  uploaded script: {_mean_se([r['script_held_out'] for r in rows])}")
    print(f"  ART client:      {_mean_se([r['client_held_out'] for r in rows])}")
    print(f"client-driven step / uploaded-script step: {client_s / script_s:.2f}")
    model_dir = ensure_default_model(Path(settings.DATA_DIR)).path.resolve()
    out = Path(tempfile.mkdtemp(prefix="artweb-client-heldout-")) / "heldout.json"
    results = heldout(model_dir, adapters, out, samples=args.heldout_samples)
    held = heldout_difference(results, seeds, first="script", second="client")
    print(f"\nheld-out reward by one evaluator ({args.heldout_samples} answers per held-out scenario), per seed:")
    for r in held["per_seed"]:
        print(f"  seed {r['seed']}: script {r['script']:.3f}, client {r['client']:.3f}, difference {r['diff']:+.3f}")
    print(f"  base model: {results['base']['reward_mean']:.3f}")
    print(f"script - client, {held['unit']}: {held['diff']:+.3f} (standard error {held['se']:.3f})")
    verdict = "within one standard error: the curves match" if held["within"] else "outside one standard error"
    print(f"learning: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
