"""Where a GPU step's rollouts phase goes: the shipped example's batch (4 scenarios x 6, at most 48 tokens,
temperature 1) against a real vLLM server with a runtime LoRA adapter, measured three ways on one server:

1. direct: the batch's 24 chat completions from an in-process AsyncOpenAI client (no sandbox, no proxy),
   base model and adapter; plus one request alone (48 tokens, ignore_eos) for the per-token latency, and
   24 x 48 tokens (ignore_eos) for the decode rate of a full batch.
2. jailed: the production path (run_rollouts: jail, sandbox processes, proxy, the example's rollout script
   and reward) with the adapter, pre-started (--settle seconds after the previous batch, as a step's update
   leaves it) and cold, alternating, each with the timeline of bench.rollout_overhead (ms from the call).
3. optional (--graphs): the same direct batches on a second server started without --enforce-eager (CUDA
   graphs), to size what eager decoding costs.

    python -m bench.gpu_rollout_gap --eager --data-dir /tmp/aw
    python -m bench.gpu_rollout_gap --instant      # no model: the stand-in server of bench.rollout_overhead

The timeline columns are those of bench.rollout_overhead, plus gen = last_ans - req1 (the proxy saw the
first request to the last answer), rq_med = median proxy time of one request, ro_med = median time of one
rollout's request as the script saw it (client built to completion returned), tokens = completion tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.rollout_overhead import REWARD_TIMES, SCRIPT_TIMES, InstantServer, Probes
from bench.task import EXAMPLES, load_scenarios, messages_for
from rollouts.sandbox.batch import SandboxLimits
from rollouts.sandbox.jail import JailConfig
from rollouts.sandbox.prestart import prestarted
from rollouts.sandbox.rollouts import RolloutRequest, run_rollouts

VOCAB_SIZE = 49152
COLUMNS = ("jail", "handed", "loaded", "client", "req1", "last_ans", "rewards", "records", "said_done", "returned")
EXTRA = ("gen", "rq_med", "ro_med", "close", "next", "tokens")
W = 10


def log(msg: str) -> None:
    print(msg, flush=True)


async def direct_batch(base_url, api_key, model, scenarios, group, sampling, concurrency) -> dict:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600)
    gate = asyncio.Semaphore(concurrency)
    extra = {k: v for k, v in sampling.items() if k not in ("max_tokens", "temperature", "top_p")}
    t0 = time.perf_counter()

    async def one(scenario) -> tuple[int, float, float]:
        async with gate:
            s = time.perf_counter()
            c = await client.chat.completions.create(
                model=model,
                messages=messages_for(scenario),
                max_tokens=sampling["max_tokens"],
                temperature=sampling.get("temperature", 1.0),
                top_p=sampling.get("top_p", 1.0),
                logprobs=True,
                extra_body={"return_token_ids": True, **extra},
            )
            e = time.perf_counter()
            return c.usage.completion_tokens, e - s, e - t0

    try:
        out = await asyncio.gather(*(one(sc) for sc in scenarios for _ in range(group)))
    finally:
        await client.close()
    wall = time.perf_counter() - t0
    toks = [o[0] for o in out]
    lat = sorted(o[1] for o in out)
    return {
        "wall": wall,
        "tokens": sum(toks),
        "max_tok": max(toks),
        "lat_min": lat[0],
        "lat_med": statistics.median(lat),
        "lat_max": lat[-1],
    }


def direct_row(label, r) -> str:
    return (
        f"{label:34} wall {r['wall'] * 1000:7.0f} ms  tokens {r['tokens']:5d} (longest {r['max_tok']:3d})  "
        f"{r['tokens'] / r['wall']:7.1f} tok/s  request ms min/med/max {r['lat_min'] * 1000:5.0f}/"
        f"{r['lat_med'] * 1000:5.0f}/{r['lat_max'] * 1000:5.0f}"
    )


def direct_suite(base_url, api_key, policies, scenarios, repeat, tag="") -> dict:
    """Direct batches for each policy; returns medians of wall by label."""
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 48}
    fixed = {**sampling, "ignore_eos": True}
    walls: dict[str, list[float]] = {}
    for policy, name in policies:
        asyncio.run(direct_batch(base_url, api_key, name, scenarios[:1], 2, {**sampling, "max_tokens": 4}, 2))
        for _ in range(repeat):
            for label, scen, group, samp, conc in (
                (f"{tag}{policy} example 24 c=32", scenarios, 6, sampling, 32),
                (f"{tag}{policy} 24x48 ignore_eos c=32", scenarios, 6, fixed, 32),
                (f"{tag}{policy} 1x48 ignore_eos alone", scenarios[:1], 1, fixed, 1),
            ):
                r = asyncio.run(direct_batch(base_url, api_key, name, scen, group, samp, conc))
                walls.setdefault(label, []).append(r["wall"])
                log(direct_row(label, r))
    log("")
    for label, values in walls.items():
        log(f"median {label:34} {statistics.median(values) * 1000:7.0f} ms")
    return walls


def jailed_batch(request: RolloutRequest, probes: Probes) -> dict[str, float]:
    probes.reset()
    arrived: list[float] = []
    t0 = time.time()
    results = run_rollouts(request, on_trajectory=lambda g, i, r: arrived.append(time.time()))
    done = time.time()
    records = [t for group in results for t in group.trajectories]
    errors = [t["error"] for t in records if t["error"]]
    if errors:
        raise RuntimeError(f"{len(errors)} rollouts failed; the first:\n{errors[0]}")
    meta = [t["metadata"] for t in records]
    p = probes.times

    def ms(at: float) -> float:
        return (at - t0) * 1000

    # Proxy request times, paired in order of arrival (the k-th answer is not always the k-th request's,
    # so only the median is reported).
    req, ans = sorted(p["req"]), sorted(p["ans"])
    return {
        "jail": ms(p["jail"][0]),
        "handed": ms(p["handed"][0]),
        "loaded": ms(min(m["t_loaded"] for m in meta)),
        "client": ms(min(m["t_client"] for m in meta)),
        "req1": ms(req[0]),
        "last_ans": ms(ans[-1]),
        "rewards": ms(max(m["t_reward"] for m in meta)),
        "records": ms(max(arrived)),
        "said_done": ms(max(p["said_done"])),
        "returned": ms(done),
        "gen": (ans[-1] - req[0]) * 1000,
        "rq_med": statistics.median(a - r for r, a in zip(req, ans, strict=True)) * 1000,
        "ro_med": statistics.median(m["t_rollout"] - m["t_client"] for m in meta) * 1000,
        "close": p["close_s"][0] * 1000,
        "next": sum(p.get("next_s", [])) * 1000,
        "tokens": float(sum(t.get("completion_tokens") or 0 for t in records)),
    }


def jailed_suite(base_url, api_key, model, scenarios, repeat, settle, concurrency) -> None:
    probes = Probes()
    probes.install()
    request = RolloutRequest(
        script=(EXAMPLES / "rollout.py").read_text() + SCRIPT_TIMES,
        reward=(EXAMPLES / "reward.py").read_text() + REWARD_TIMES,
        scenarios=scenarios,
        group_size=6,
        base_url=base_url,
        model_name=model,
        api_key=api_key,
        sampling={"temperature": 1.0, "top_p": 1.0, "max_tokens": 48},
        concurrency=concurrency,
        max_exceptions=0,
        limits=SandboxLimits(rollout_timeout_s=120.0),
        jail=JailConfig(),
        vocab_size=VOCAB_SIZE,
    )
    warm = dataclasses.replace(request, warm_key="bench-gap", prestart_next=True)
    t = time.perf_counter()
    run_rollouts(warm)  # one-time costs (jail check, proxy), and the first pre-started batch
    log(f"first (untimed) jailed batch: {(time.perf_counter() - t) * 1000:.0f} ms")
    header = f"{'batch':16}" + "".join(f"{c:>{W}}" for c in (*COLUMNS, *EXTRA))
    log(f"\njailed timeline, ms from the call (model {model}, concurrency {concurrency})")
    log(header)
    rows: dict[str, list[dict]] = {}
    try:
        for _ in range(repeat):
            for kind, req, wait in (
                (f"pre {settle:g}s", warm, settle),
                ("pre 3s", warm, 3.0),
                ("cold", request, 1.0),
            ):
                time.sleep(wait)
                row = jailed_batch(req, probes)
                rows.setdefault(kind, []).append(row)
                log(f"{kind:16}" + "".join(f"{row[c]:{W}.0f}" for c in (*COLUMNS, *EXTRA)))
    finally:
        prestarted.discard()
    log(f"median of {repeat}")
    log(header)
    for kind, found in rows.items():
        log(f"{kind:16}" + "".join(f"{statistics.median(r[c] for r in found):{W}.0f}" for c in (*COLUMNS, *EXTRA)))


def start_vllm(model_dir: str, eager: bool):
    from rollouts.inference.vllm_server import VLLMServer

    server = VLLMServer(
        model_dir,
        max_model_len=2048,
        adapter_mode="lora",
        enforce_eager=eager,
        kv_cache_gb=2,
        log_dir=tempfile.mkdtemp(prefix="artweb-gap-"),
    )
    t = time.perf_counter()
    server.start()
    log(f"vLLM (eager={eager}, lora mode, max_lora_rank {server.max_lora_rank}) up in {time.perf_counter() - t:.0f} s")
    return server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=os.environ.get("ARTWEB_DATA_DIR", "data"))
    ap.add_argument("--eager", action="store_true", help="--enforce-eager, as the GPU comparison ran")
    ap.add_argument("--instant", action="store_true", help="the instant stand-in server instead of vLLM")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--settle", type=float, default=1.0, help="seconds before a pre-started batch (besides 3 s)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--graphs", action="store_true", help="then direct batches on a server with CUDA graphs")
    ap.add_argument("--budget", type=float, default=1e9, help="skip --graphs past this many seconds")
    args = ap.parse_args()
    began = time.perf_counter()
    log(f"{sys.version.split()[0]}, {os.cpu_count()} cores")
    scenarios = load_scenarios()["train"][:4]
    server = None
    if args.instant:
        import secrets

        key = secrets.token_urlsafe(16)
        inst = InstantServer(key).start()
        base_url, api_key, policies = inst.base_url, key, [("instant", "policy@1")]
    else:
        from bench.rollout_bench import make_adapter
        from training.engine.default_model import ensure_default_model

        model_dir = str(ensure_default_model(Path(args.data_dir)).path)
        server = start_vllm(model_dir, args.eager)
        base_url, api_key = server.base_url, server.api_key
        base = server.ensure_base()
        adapter = make_adapter(server.model_path, Path(tempfile.mkdtemp(prefix="artweb-gap-adapter-")))
        t = time.perf_counter()
        name = server.ensure_adapter("bench@1", str(adapter))
        log(f"adapter loaded in {(time.perf_counter() - t) * 1000:.0f} ms")
        policies = [("base", base), ("adapter", name)]
    try:
        if not args.instant:
            direct_suite(base_url, api_key, policies, scenarios, args.repeat)
        jailed_suite(base_url, api_key, policies[-1][1], scenarios, args.repeat, args.settle, args.concurrency)
        if not args.instant:
            direct_suite(base_url, api_key, policies[-1:], scenarios, 1, tag="again ")
    finally:
        if server is not None:
            server.stop()
    if args.graphs and not args.instant:
        if time.perf_counter() - began > args.budget:
            log(f"--graphs skipped: {time.perf_counter() - began:.0f} s spent, budget {args.budget:g}")
            return
        server = start_vllm(model_dir, eager=False)
        try:
            name = server.ensure_adapter("bench@1", str(adapter))
            direct_suite(
                server.base_url,
                server.api_key,
                [("base", server.ensure_base()), ("adapter", name)],
                scenarios,
                args.repeat,
                tag="graphs ",
            )
        finally:
            server.stop()
    log(f"total {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
