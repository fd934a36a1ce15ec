"""artweb against TRL's GRPOTrainer with vLLM colocated, on one GPU, in one command: the step-time ratio.

    python -m bench.gpu_trl_compare --steps 10 --eager --out bench/results/gpu_trl_compare.md

1. artweb: a run of the shipped example task through the real GPU worker, as `bench.gpu_run` runs it
   (embedded PostgreSQL and Redis, the Celery GPU worker, vLLM with runtime LoRA adapters, rollouts in
   the jailed sandbox, the Unsloth backend).
2. TRL: `GRPOTrainer` in a process of its own (`bench.trl_grpo train --generation vllm-colocate`) on the
   same GPU once the worker is gone: the same model, scenarios per step (the same scenarios), reward file,
   group size, completion length, learning rate, LoRA, loss and optimizer settings and step count; vLLM in
   the trainer's process, the merged weights pushed to it after every step.

Prints the per-step times of both, the ratio of the median step times (target: artweb at most 0.5x TRL),
tokens/s, GPU memory and the versions, and writes them to --out. --eager starts both vLLM engines
without CUDA graphs (saves minutes of start-up; both sides alike).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
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

REPO = Path(__file__).resolve().parents[1]


def _median(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def trl_env() -> dict[str, str]:
    """TRL's process environment: vLLM's sampler without FlashInfer where it is not installed, as artweb's
    server is started (vLLM would import it and fail)."""
    import importlib.util

    env = dict(os.environ)
    if importlib.util.find_spec("flashinfer") is None:
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def run_trl(args, model_dir: Path, work: Path) -> dict:
    """TRL's GRPO steps with vLLM colocated, in a subprocess; its result, with the GPU's peak memory."""
    cmd = [
        sys.executable,
        "-m",
        "bench.trl_grpo",
        "train",
        "--device",
        "cuda",
        "--generation",
        "vllm-colocate",
        "--gradient-checkpointing",
        "off",
        "--vllm-memory",
        str(args.trl_vllm_memory),
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
        *(["--vllm-eager"] if args.eager else []),
    ]
    log = work / "trl-train.log"
    started = time.perf_counter()
    with GpuMemory() as gpu, log.open("w") as fh:
        done = subprocess.run(cmd, cwd=REPO, env=trl_env(), stdout=fh, stderr=subprocess.STDOUT, check=False)
    if done.returncode:
        raise SystemExit(f"TRL failed ({done.returncode}); the end of its log:\n" + log.read_text()[-6000:])
    result = json.loads((work / "trl-train.json").read_text())
    result["process_seconds"] = time.perf_counter() - started
    result["gpu_peak_mib"] = gpu.peak_mib
    result["command"] = shlex.join(["python", *cmd[1:]])
    return result


def report(args, artweb: dict, trl: dict, meta: dict) -> str:
    a_steps, t_steps = artweb["steps"], trl["steps"]
    later_a, later_t = a_steps[1:] or a_steps, t_steps[1:] or t_steps
    a_step = _median(s["seconds"] for s in a_steps)
    t_step = _median(s["seconds"] for s in t_steps)
    a_roll = _median(s["timings"].get("rollouts") for s in a_steps)
    a_train = _median(s["timings"].get("train") for s in a_steps)
    t_gen = _median(s["generate_seconds"] for s in t_steps)
    t_rest = _median(s["seconds"] - s["generate_seconds"] for s in t_steps)
    a_tok = _median(s["completion_tokens"] / s["timings"]["rollouts"] for s in a_steps if s["timings"].get("rollouts"))
    t_tok = _median(s["completion_tokens"] / s["generate_seconds"] for s in t_steps)
    a_trained = _median(s["tokens_trained"] / s["timings"]["train"] for s in a_steps if s["timings"].get("train"))
    t_trained = _median(s["completion_tokens"] / (s["seconds"] - s["generate_seconds"]) for s in t_steps)
    ratio = a_step / t_step
    phases = ("rollouts", "persist", "trainer_load", "train", "checkpoint", "adapter_load", "step")
    lines = [
        f"# artweb vs TRL GRPOTrainer (vLLM colocate) on one GPU ({time.strftime('%Y-%m-%d')})",
        "",
        f"- GPU: {meta['versions'].get('gpu', 'none')}.",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if k != "gpu") + ".",
        f"- Command: `{meta['command']}`",
        f"- Settings (both): the default model (SmolLM2-135M-Instruct, real weights), {args.steps} steps, "
        f"{args.scenarios_per_step} scenarios x group of {args.group_size} per step (the same scenarios each step), "
        f"at most {args.max_tokens} completion tokens, temperature 1, learning rate {args.learning_rate:g} constant, "
        "LoRA r=8 alpha 16 on all attention and MLP projections, AdamW (beta2 0.99, weight decay 0.1), gradient "
        "norm clip 0.1, CISPO (ratio capped at 5), group-std advantage scaling, no KL, bf16 base weights, no "
        "gradient checkpointing, no validation.",
        "- artweb: the Celery GPU worker (prefork, concurrency 1), ARTWEB_TRAINER_BACKEND=unsloth, "
        f"ARTWEB_VLLM_ADAPTER_MODE=lora, vLLM {'eager' if args.eager else 'with CUDA graphs'} in its own server "
        f"process, rollouts in the sandbox ({meta['sandbox']}), PostgreSQL and Redis embedded.",
        f"- TRL: `{trl['command']}`; vLLM {'eager' if args.eager else 'with CUDA graphs'} in the trainer's "
        f"process (colocate, {args.trl_vllm_memory:g} of the GPU's memory), PEFT LoRA, merged weights pushed to "
        "vLLM each step; its other GRPOConfig settings are TRL's defaults (e.g. vLLM importance-sampling "
        "correction on).",
        "- Neither side's first step includes its start-up (artweb: the worker and vLLM server; TRL: the trainer "
        f"and its vLLM engine, {trl.get('setup_seconds', float('nan')):.0f} s); artweb's first step includes "
        "importing Unsloth and loading the model into the trainer (phase trainer_load).",
        "",
        "## Step time",
        "",
        "| | artweb | TRL | artweb / TRL |",
        "|---|---:|---:|---:|",
        f"| wall time per step, median of all steps (s) | {a_step:.2f} | {t_step:.2f} | **{ratio:.2f}** |",
        f"| wall time per step, median of steps 2+ (s) | {_median(s['seconds'] for s in later_a):.2f} | "
        f"{_median(s['seconds'] for s in later_t):.2f} | "
        f"{_median(s['seconds'] for s in later_a) / _median(s['seconds'] for s in later_t):.2f} |",
        f"| total of the {args.steps} steps (s) | {sum(s['seconds'] for s in a_steps):.1f} | "
        f"{sum(s['seconds'] for s in t_steps):.1f} | "
        f"{sum(s['seconds'] for s in a_steps) / sum(s['seconds'] for s in t_steps):.2f} |",
        f"| generation: artweb rollouts phase / TRL generate+score, median (s) | {a_roll:.2f} | {t_gen:.2f} | "
        f"{a_roll / t_gen:.2f} |",
        f"| update: artweb train phase / TRL rest of the step, median (s) | {a_train:.2f} | {t_rest:.2f} | "
        f"{a_train / t_rest:.2f} |",
        f"| completion tokens/s in generation, median | {a_tok:.0f} | {t_tok:.0f} | |",
        f"| trained tokens/s, median | {a_trained:.0f} | {t_trained:.0f} | |",
        f"| peak GPU memory in use (GiB, nvidia-smi) | {artweb['gpu_peak_mib'] / 1024:.1f} | "
        f"{trl['gpu_peak_mib'] / 1024:.1f} | |",
        "",
        f"Step-time ratio artweb / TRL: {ratio:.2f} (target: at most 0.5).",
        "",
        "## Per step",
        "",
        "| step | artweb s | artweb rollouts s | artweb train s | artweb reward | TRL s | TRL generate s | TRL reward |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i in range(max(len(a_steps), len(t_steps))):
        a = a_steps[i] if i < len(a_steps) else None
        t = t_steps[i] if i < len(t_steps) else None
        cells = [str(i + 1)]
        cells += (
            [
                f"{a['seconds']:.2f}",
                f"{a['timings'].get('rollouts', float('nan')):.2f}",
                f"{a['timings'].get('train', float('nan')):.2f}",
                f"{a['reward_mean']:.3f}" if a["reward_mean"] is not None else "",
            ]
            if a
            else ["", "", "", ""]
        )
        cells += (
            [f"{t['seconds']:.2f}", f"{t['generate_seconds']:.2f}", f"{t.get('reward_mean', float('nan')):.3f}"]
            if t
            else ["", "", ""]
        )
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Where an artweb step's time goes (median s)",
        "",
        "| " + " | ".join(phases) + " |",
        "|" + "---:|" * len(phases),
        "| " + " | ".join(f"{_median(s['timings'].get(p) for s in a_steps):.2f}" for p in phases) + " |",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--group-size", type=int, default=6)
    parser.add_argument("--scenarios-per-step", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--eager", action="store_true", help="both vLLM engines without CUDA graphs")
    parser.add_argument("--trl-vllm-memory", type=float, default=0.3, help="TRL's vllm_gpu_memory_utilization")
    parser.add_argument("--model-wheel", help="a local copy of the default model's wheel (no package index)")
    parser.add_argument("--data-dir", help="default: a new temporary directory")
    parser.add_argument("--out", help="also write the report to this markdown file")
    parser.add_argument("--artweb-result", help="the artweb side from an earlier run's artweb-result.json")
    args = parser.parse_args()
    # What bench.gpu_run's helpers read.
    args.device, args.backend, args.adapter_mode = "cuda", "unsloth", "lora"

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
        from django.conf import settings
        from django.core.management import call_command

        from training.engine.default_model import ensure_default_model

        call_command("migrate", verbosity=0)
        model_dir = ensure_default_model(Path(settings.DATA_DIR)).path.resolve()
        t0 = time.perf_counter()
        print("artweb run ...", flush=True)
        artweb = (
            json.loads(Path(args.artweb_result).read_text())
            if args.artweb_result
            else run_example(
                steps=args.steps,
                group_size=args.group_size,
                scenarios_per_step=args.scenarios_per_step,
                max_tokens=args.max_tokens,
                learning_rate=args.learning_rate,
                val_every=0,
                timeout=args.timeout,
                logs_dir=data_dir / "worker-logs",
            )
        )
        (data_dir / "artweb-result.json").write_text(json.dumps(artweb, default=str))
        print(json.dumps({"artweb": artweb}, default=str), flush=True)
        if artweb["status"] != "completed":
            raise SystemExit(f"the artweb run ended {artweb['status']}: {artweb['error']}")
        print(f"[{time.perf_counter() - t0:.0f} s] TRL GRPOTrainer with vLLM colocate ...", flush=True)
        work = data_dir / "trl"
        work.mkdir(parents=True, exist_ok=True)
        print(f"GPU memory in use before TRL starts: {wait_for_gpu_free()} MiB", flush=True)
        trl = run_trl(args, model_dir, work)
        print(json.dumps({"trl": trl}, default=str), flush=True)
    finally:
        from artweb.launcher.embedded import stop_services

        stop_services(services)
    meta = {
        "command": "python -m bench.gpu_trl_compare " + shlex.join(sys.argv[1:]),
        "sandbox": sandbox,
        "versions": versions(),
    }
    text = report(args, artweb, trl, meta)
    print(text, flush=True)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
