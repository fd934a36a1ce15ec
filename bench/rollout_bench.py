"""Rollout throughput on the inference server: direct requests vs. the SDK in the sandbox (jailed, and
with the development opt-out), base model vs. a step's adapter, at several concurrency levels; the
jail's start-up time; and a batch's sandbox start-up, cold and pre-started.

    python bench/rollout_bench.py                      # starts vLLM for the default model
    python bench/rollout_bench.py --startup-only       # only the start-up figures: no inference server
    python bench/rollout_bench.py --adapter-mode lora  # the same with vLLM's runtime LoRA instead
    python bench/rollout_bench.py --base-url http://127.0.0.1:8000/v1 --model NAME --api-key KEY  # a running server

Every rollout is one chat completion of exactly --tokens tokens (ignore_eos), so tokens/s compare
like for like. Targets: the jailed sandbox (jail + inference proxy) ≥ 90% of direct requests (the
sandbox before the jail called vLLM directly and measured the same as direct); jail start-up < 100 ms;
adapter ≥ 70% of base.

The sandbox start-up is the wall time of a batch shaped like the shipped example's step (4 groups of 6)
whose rollouts only build their OpenAI client: started cold, and handed to processes pre-started a few
seconds earlier, as a run's step pre-starts its next batch while it trains (the pre-start of the batch
after it is inside the measured time, as it is inside a step's rollouts).
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.cpu_isa import ISA_ENV, cpu_flags, reexec_with
from rollouts.sandbox.batch import SandboxLimits, default_sandboxes
from rollouts.sandbox.jail import OPT_OUT, JailConfig
from rollouts.sandbox.prestart import prestarted
from rollouts.sandbox.rollouts import RolloutRequest, run_rollouts

SCRIPT = """
import art

async def rollout(model: art.Model, scenario) -> art.Trajectory:
    client = model.openai_client()
    messages = [{"role": "user", "content": scenario.prompt}]
    completion = await client.chat.completions.create(model=model.name, messages=messages)
    return art.Trajectory(messages_and_choices=[*messages, completion.choices[0]], reward=0.0)
"""


STARTUP_SCRIPT = """
import art

async def rollout(model: art.Model, scenario) -> art.Trajectory:
    model.openai_client()  # what a rollout does first; no request is sent
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=0.0)
"""

KINDS = ("direct", "unjailed", "jailed")  # in-process client; sandbox with the opt-out; sandbox in its jail


def prompts(n: int) -> list[str]:
    return [f"Tell a short story about a robot called Unit {i}." for i in range(n)]


async def direct(base_url: str, api_key: str, model: str, n: int, concurrency: int, sampling: dict) -> int:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=1800)
    gate = asyncio.Semaphore(concurrency)
    extra = {k: v for k, v in sampling.items() if k not in ("max_tokens", "temperature")}

    async def one(prompt: str) -> int:
        async with gate:
            completion = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=sampling["max_tokens"],
                temperature=sampling["temperature"],
                logprobs=True,
                extra_body={"return_token_ids": True, **extra},
            )
            return completion.usage.completion_tokens

    try:
        return sum(await asyncio.gather(*(one(p) for p in prompts(n))))
    finally:
        await client.close()


def sandboxed(
    base_url: str, api_key: str, model: str, n: int, concurrency: int, sampling: dict, jail: JailConfig
) -> int:
    # Groups of 4, as a run would send them; one sandbox process per 4 groups at most.
    group = 4 if n % 4 == 0 else 1
    request = RolloutRequest(
        script=SCRIPT,
        reward=None,
        scenarios=[{"prompt": p} for p in prompts(n // group)],
        group_size=group,
        base_url=base_url,
        api_key=api_key,
        model_name=model,
        sampling=sampling,
        concurrency=concurrency,
        max_exceptions=0,
        limits=SandboxLimits(rollout_timeout_s=1800),
        jail=jail,
    )
    results = run_rollouts(request)
    return sum(t["completion_tokens"] for g in results for t in g.trajectories)


def measure(
    kind: str, base_url: str, api_key: str, model: str, n: int, concurrency: int, sampling: dict
) -> tuple[int, float]:
    started = time.perf_counter()
    if kind == "direct":
        tokens = asyncio.run(direct(base_url, api_key, model, n, concurrency, sampling))
    else:
        tokens = sandboxed(
            base_url, api_key, model, n, concurrency, sampling, JailConfig(mode="jail" if kind == "jailed" else OPT_OUT)
        )
    return tokens, time.perf_counter() - started


def jail_startup(runs: int = 20) -> tuple[float, float]:
    """Median ms from nothing to a jailed /bin/true that has exited, the batch's cgroup and staging
    included (what every batch pays before Python starts; bench/jail_start.py measures it with and without
    the seccomp filter), against a plain subprocess."""
    import subprocess

    from bench.jail_start import batch_ms

    config = JailConfig()
    jailed, plain = [], []
    for _ in range(runs):
        jailed.append(batch_ms(config, filtered=True))
        started = time.perf_counter()
        subprocess.run(["/bin/true"], check=True)
        plain.append((time.perf_counter() - started) * 1000)
    return statistics.median(jailed), statistics.median(plain)


def sandbox_startup(runs: int = 5, settle_s: float = 3.0) -> tuple[float, float]:
    """Median ms of the start-up batch (see the module's docstring), cold and pre-started settle_s earlier."""
    request = RolloutRequest(
        script=STARTUP_SCRIPT,
        reward=None,
        scenarios=[{"i": i} for i in range(4)],
        group_size=6,
        base_url="http://127.0.0.1:9/v1",
        model_name="none",
        max_exceptions=0,
        limits=SandboxLimits(rollout_timeout_s=120),
    )
    warm = dataclasses.replace(request, warm_key="bench-startup", prestart_next=True)
    run_rollouts(warm)  # starts the first pre-started batch
    cold_s, warm_s = [], []
    try:
        for _ in range(runs):
            # Each measured batch starts settle_s after the previous one ended: the pre-started batch has
            # imported what it imports, and nothing else of the benchmark runs beside the measured one.
            time.sleep(settle_s)
            started = time.perf_counter()
            run_rollouts(warm)
            warm_s.append(time.perf_counter() - started)
            time.sleep(settle_s)
            started = time.perf_counter()
            run_rollouts(request)
            cold_s.append(time.perf_counter() - started)
    finally:
        prestarted.discard()
    return statistics.median(cold_s) * 1000, statistics.median(warm_s) * 1000


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def make_adapter(base_dir: str, out_dir: Path, rank: int = 8) -> Path:
    """A random rank-8 LoRA on every linear layer, as the trainer would save after a step."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft_model = get_peft_model(
        model,
        LoraConfig(
            r=rank,
            lora_alpha=2 * rank,
            task_type="CAUSAL_LM",
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        ),
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 1e-3)
    peft_model.save_pretrained(str(out_dir))
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", help="use a running server instead of starting one")
    parser.add_argument("--model", help="model name on --base-url")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("VLLM_API_KEY", "EMPTY"),
        help="the key of the server on --base-url (default: $VLLM_API_KEY)",
    )
    parser.add_argument("--adapter-mode", default="auto", choices=["auto", "merged", "lora"])
    parser.add_argument(
        "--engine", default="vllm", choices=["vllm", "ctranslate2"], help="the inference server to start"
    )
    parser.add_argument(
        "--isa",
        default="native",
        choices=sorted(ISA_ENV),
        help="take another processor's code paths (bench/cpu_isa.py)",
    )
    parser.add_argument("--concurrency", default="4,8,16")
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3, help="rounds per concurrency level (median reported)")
    parser.add_argument("--no-adapter", action="store_true", help="measure the base model only")
    parser.add_argument("--data-dir", default=os.environ.get("ARTWEB_DATA_DIR", str(REPO / "data")))
    parser.add_argument("--startup-only", action="store_true", help="measure start-up only; no inference server")
    args = parser.parse_args()
    reexec_with(args.isa)
    sampling = {"max_tokens": args.tokens, "temperature": 1.0, "ignore_eos": True}
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"{cpu_name()}, {os.cpu_count()} cores; flags: {cpu_flags()} (code paths: {args.isa})", flush=True)
    print(f"inference server: {args.base_url or args.engine}", flush=True)
    jail_ms, plain_ms = jail_startup()
    print(
        f"jail start-up: {jail_ms:.1f} ms median (cgroup, staging, bwrap, /bin/true), plain subprocess "
        f"{plain_ms:.1f} ms",
        flush=True,
    )
    cold_ms, warm_ms = sandbox_startup()
    print(
        f"sandbox start-up (a batch of 4 groups x 6 that builds its OpenAI client): cold {cold_ms:.0f} ms, "
        f"pre-started {warm_ms:.0f} ms median ({default_sandboxes()} sandbox processes)",
        flush=True,
    )
    if args.startup_only:
        return

    server = None
    base_url, base_name, api_key = args.base_url, args.model, args.api_key
    if base_url is None and args.engine == "ctranslate2":
        from rollouts.inference.ct2_server import CT2Server
        from training.engine.default_model import ensure_default_model

        model_dir = str(ensure_default_model(Path(args.data_dir)).path)
        server = CT2Server(model_dir, max_model_len=2048, log_dir=tempfile.mkdtemp(prefix="artweb-bench-"))
        print(f"starting the CTranslate2 server, log in {server.log_dir}", flush=True)
        started = time.perf_counter()
        server.start()
        print(f"CTranslate2 server up in {time.perf_counter() - started:.0f} s", flush=True)
        base_url, base_name, api_key = server.base_url, server.ensure_base(), server.api_key
    if base_url is None:
        from rollouts.inference.vllm_server import VLLMServer
        from training.engine.default_model import ensure_default_model

        model_dir = str(ensure_default_model(Path(args.data_dir)).path)
        server = VLLMServer(
            model_dir,
            max_model_len=2048,
            kv_cache_gb=2,
            adapter_mode=args.adapter_mode,
            max_lora_rank=8,
            log_dir=tempfile.mkdtemp(prefix="artweb-bench-"),
        )
        print(f"starting vLLM ({server.adapter_mode} mode requested), log in {server.log_dir}", flush=True)
        started = time.perf_counter()
        server.start()
        print(f"vLLM up in {time.perf_counter() - started:.0f} s, {server.adapter_mode} mode", flush=True)
        base_url, base_name, api_key = server.base_url, server.ensure_base(), server.api_key
    try:
        policies = [("base", base_name)]
        if server is not None and not args.no_adapter:
            policies.append(("adapter", None))
        rows = []
        for policy, name in policies:
            if policy == "adapter":
                adapter = make_adapter(server.model_path, Path(tempfile.mkdtemp(prefix="artweb-bench-adapter-")))
                started = time.perf_counter()
                name = server.ensure_adapter("bench@1", str(adapter))
                print(f"adapter loaded in {time.perf_counter() - started:.1f} s ({server.adapter_mode})", flush=True)
            measure("direct", base_url, api_key, name, 2, 2, {**sampling, "max_tokens": 4})  # warm-up
            for concurrency in levels:
                # Rounds alternate the kinds, so a slow moment of the machine does not land on one of them.
                for _ in range(args.repeat):
                    for kind in KINDS:
                        tokens, seconds = measure(kind, base_url, api_key, name, args.rollouts, concurrency, sampling)
                        rows.append((policy, kind, concurrency, tokens, seconds))
                        print(
                            f"{policy:8} {kind:8} c={concurrency:<3} {tokens:6d} tok {seconds:7.2f} s "
                            f"{tokens / seconds:8.1f} tok/s {args.rollouts / seconds:6.2f} rollouts/s",
                            flush=True,
                        )
        print(f"\nsummary (tokens/s, median of {args.repeat})")
        by_key = {
            key: statistics.median(t / s for p, k, c, t, s in rows if (p, k, c) == key)
            for key in {(p, k, c) for p, k, c, _, _ in rows}
        }
        for concurrency in levels:
            line = f"c={concurrency:<3}"
            for policy, _ in policies:
                d, u, j = (by_key[(policy, kind, concurrency)] for kind in KINDS)
                line += (
                    f"  {policy}: direct {d:6.1f} unjailed {u:6.1f} jailed {j:6.1f} "
                    f"(jailed/direct {j / d:4.0%}, jailed/unjailed {j / u:4.0%})"
                )
            if len(policies) == 2:
                line += (
                    f"  adapter/base: direct {by_key[('adapter', 'direct', concurrency)] / by_key[('base', 'direct', concurrency)]:4.0%}"
                    f" jailed {by_key[('adapter', 'jailed', concurrency)] / by_key[('base', 'jailed', concurrency)]:4.0%}"
                )
            print(line)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
