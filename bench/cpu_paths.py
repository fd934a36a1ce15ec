"""Where the CPU build of vLLM spends its time, per instruction set and dtype, on this processor.

    python bench/cpu_paths.py [--rollouts 16] [--tokens 64] [--isa native,avx512,avx2] [--dtype bfloat16,float16,float32]

For every (instruction set, dtype) pair it starts vLLM's CPU server for the default model, as the worker
does (merged weights, the worker's threads and preloads), and times --rollouts chat completions of
exactly --tokens tokens each (ignore_eos, logprobs and token ids on, all in flight at once): the
dtypes of one instruction set side by side, three rounds alternating between them, medians reported,
after one greedy answer checked for text and finite log-probs (a path that
answers garbage is reported as such, not timed). `avx2` makes this processor take an AVX2-only one's
code paths, `avx512` those of one with AVX-512 but no bf16/AMX units (bench/isa/sitecustomize.py): the
kernels such a processor runs, at this one's clock and memory speed.
Prints the CPU model and flags and one line per pair; writes bench/results/cpu_paths.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from artweb.launcher.worker import gpu_worker_env
from bench.cpu_isa import ISA_ENV, cpu_flags
from bench.rollout_bench import cpu_name, direct
from rollouts.inference.vllm_server import VLLMServer
from training.engine.default_model import ensure_default_model

RESULTS = REPO / "bench" / "results" / "cpu_paths.md"


def start(model_dir: str, isa: str, dtype: str) -> tuple[VLLMServer, float]:
    env = {k: v for k, v in gpu_worker_env(dict(os.environ)).items() if k in ("OMP_NUM_THREADS", "LD_PRELOAD")}
    server = VLLMServer(
        model_dir,
        max_model_len=2048,
        kv_cache_gb=2,
        adapter_mode="merged",
        log_dir=tempfile.mkdtemp(prefix="artweb-cpu-paths-"),
        extra_args=["--dtype", dtype],
        extra_env={**env, **ISA_ENV[isa]},
    )
    started = time.perf_counter()
    server.start()
    return server, time.perf_counter() - started


def usable_answer(server: VLLMServer, name: str) -> str | None:
    """None when the server answers a greedy question with text and finite log-probs; else what it said."""
    check = httpx.post(
        f"{server.base_url}/chat/completions",
        headers=server.headers,
        json={
            "model": name,
            "messages": [{"role": "user", "content": "What is 2+2?"}],
            "max_tokens": 16,
            "temperature": 0,
            "logprobs": True,
        },
        timeout=600,
    )
    if check.status_code == 200 and check.json()["choices"][0]["message"]["content"].strip():
        return None
    return f"HTTP {check.status_code}: {check.text[:120]!r}"


def measure_isa(model_dir: str, isa: str, dtypes: list[str], rollouts: int, tokens: int) -> list[dict]:
    """Every dtype's server up at once, then rounds alternating between them: whatever else the machine
    does at a moment weighs on all of them alike."""
    sampling = {"max_tokens": tokens, "temperature": 1.0, "ignore_eos": True}
    servers, rows = {}, {}
    try:
        for dtype in dtypes:
            server, up_s = start(model_dir, isa, dtype)
            name = server.ensure_base()
            broken = usable_answer(server, name)
            rows[dtype] = {"isa": isa, "dtype": dtype, "up_s": up_s, "rounds": []}
            if broken:
                rows[dtype]["broken"] = broken
                server.stop()
                continue
            servers[dtype] = (server, name)
            asyncio.run(direct(server.base_url, server.api_key, name, 2, 2, {**sampling, "max_tokens": 8}))  # warm-up
        for _ in range(3):
            for dtype, (server, name) in servers.items():
                t = time.perf_counter()
                n = asyncio.run(direct(server.base_url, server.api_key, name, rollouts, rollouts, sampling))
                rows[dtype]["rounds"].append((n, time.perf_counter() - t))
    finally:
        for server, _ in servers.values():
            server.stop()
    for row in rows.values():
        if row["rounds"]:
            row["seconds"] = statistics.median(s for _, s in row["rounds"])
            row["tok_s"] = row["rounds"][0][0] / row["seconds"]
    return list(rows.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--isa", default="native,avx512,avx2")
    parser.add_argument("--dtype", default="bfloat16,float16,float32")
    parser.add_argument("--data-dir", default=os.environ.get("ARTWEB_DATA_DIR", str(REPO / "data")))
    args = parser.parse_args()
    model_dir = str(ensure_default_model(Path(args.data_dir)).path)
    header = [
        f"CPU: {cpu_name()}, {os.cpu_count()} cores; flags: {cpu_flags()}; load average {os.getloadavg()[0]:.1f}",
        f"vLLM CPU server, default model, merged weights, {args.rollouts} rollouts x {args.tokens} tokens in flight",
    ]
    for line in header:
        print(line, flush=True)
    rows = []
    for isa in args.isa.split(","):
        for r in measure_isa(model_dir, isa, args.dtype.split(","), args.rollouts, args.tokens):
            rows.append(r)
            if "broken" in r:
                print(f"{isa:>6} {r['dtype']:>8}: no usable answer ({r['broken']})", flush=True)
            else:
                print(
                    f"{isa:>6} {r['dtype']:>8}: {r['seconds']:.2f} s, {r['tok_s']:.0f} tok/s "
                    f"(server up in {r['up_s']:.0f} s)",
                    flush=True,
                )
    command = f"python bench/cpu_paths.py --rollouts {args.rollouts} --tokens {args.tokens} --isa {args.isa} --dtype {args.dtype}"
    RESULTS.write_text(
        "# vLLM CPU paths by instruction set and dtype\n\n"
        f"`{command}` ({time.strftime('%Y-%m-%d')}); written by `bench/cpu_paths.py`.\n\n"
        + "".join(f"- {line}\n" for line in header)
        + "\n| instruction set | dtype | seconds | tok/s |\n|---|---|---|---|\n"
        + "".join(
            f"| {r['isa']} | {r['dtype']} | no usable answer: {r['broken']} | - |\n"
            if "broken" in r
            else f"| {r['isa']} | {r['dtype']} | {r['seconds']:.2f} | {r['tok_s']:.0f} |\n"
            for r in rows
        )
    )


if __name__ == "__main__":
    main()
