"""The report of `bench.gpu_trl_compare`: each side's step, phases, tokens/s, MFU of the update and GPU memory.

Pure functions of the two sides' figures (no GPU, no database), so the arithmetic is tested on its own.

MFU of the update: trained tokens per second of the update phase x 6N / the GPU's peak dense bf16 FLOP/s, where
N is the number of weights a token is multiplied by (every parameter of the model's safetensors files but the
input embedding table, a lookup; the output head counts). 6N per token is the usual estimate of full training
(forward 2N, backward 4N) and the one published MFU figures use; LoRA skips the base weights' gradients, so the
work a LoRA update needs is nearer 4N, two-thirds of the figure. Recomputation (gradient checkpointing),
attention's own FLOPs and the prompt tokens are not counted.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

# Peak dense (no sparsity) bf16 tensor-core FLOP/s, by the GPU's name as nvidia-smi gives it.
PEAK_BF16_FLOPS = (
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM (HBM3)
    ("A100", 312e12),
)
FLOPS_PER_PARAMETER = 6
PHASES = ("rollouts", "persist", "trainer_load", "train", "checkpoint", "adapter_load", "step")


def median(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def counted(steps: list[dict]) -> list[dict]:
    """The steps the figures are medians of: steps 2+ where there are at least 3 (step 1 holds one-off work:
    artweb's trainer load and first compile, TRL's first compiles), else all of them."""
    return steps[1:] if len(steps) >= 3 else steps


def counted_words(steps: list[dict]) -> str:
    return "steps 2+" if len(steps) >= 3 else "all steps"


def peak_bf16_flops(gpu: str | None) -> float | None:
    """The GPU's peak dense bf16 FLOP/s from its name (versions()'s "gpu" entry); None where it is not known."""
    name = (gpu or "").split(",")[0]
    return next((flops for key, flops in PEAK_BF16_FLOPS if key in name), None)


def matmul_parameters(model_dir: Path) -> int | None:
    """The weights a token is multiplied by, from the safetensors headers of model_dir: all parameters but the
    input embedding table where the output head is a table of its own (tied, the one table is the head).
    None where the directory holds no safetensors file."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    shapes: dict[str, list[int]] = {}
    for path in files:
        with path.open("rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        shapes.update({name: meta["shape"] for name, meta in header.items() if name != "__metadata__"})
    total = sum(math.prod(shape) for shape in shapes.values())
    embeddings = [name for name in shapes if name.endswith("embed_tokens.weight")]
    if embeddings and any(name.endswith("lm_head.weight") for name in shapes):
        total -= math.prod(shapes[embeddings[0]])
    return total


def mfu(tokens_per_second: float, parameters: int | None, peak_flops: float | None) -> float | None:
    """Model FLOPs utilisation: tokens/s x FLOPS_PER_PARAMETER x parameters / peak FLOP/s (None: not known)."""
    if not parameters or not peak_flops or tokens_per_second is None or math.isnan(tokens_per_second):
        return None
    return tokens_per_second * FLOPS_PER_PARAMETER * parameters / peak_flops


def artweb_figures(run: dict, parameters: int | None, peak_flops: float | None) -> dict:
    """artweb's medians over the counted steps: generation is the rollouts phase, the update the train phase."""
    steps = counted(run["steps"])
    timing = [s["timings"] for s in steps]
    figures = {
        "step_all": median(s["seconds"] for s in run["steps"]),
        "step": median(s["seconds"] for s in steps),
        "generation": median(t.get("rollouts") for t in timing),
        "update": median(t.get("train") for t in timing),
        "generation_tps": median(
            s["completion_tokens"] / s["timings"]["rollouts"] for s in steps if s["timings"].get("rollouts")
        ),
        "trained_tps": median(s["tokens_trained"] / s["timings"]["train"] for s in steps if s["timings"].get("train")),
        "gpu_peak_gib": run["gpu_peak_mib"] / 1024,
        "total": sum(s["seconds"] for s in run["steps"]),
    }
    figures["mfu"] = mfu(figures["trained_tps"], parameters, peak_flops)
    return figures


def trl_figures(trl: dict, parameters: int | None, peak_flops: float | None) -> dict:
    """TRL's medians over the counted steps: generation is its generate+score call (the weights pushed to vLLM,
    vLLM's generation, the reward, and with TRL's importance-sampling correction a no-grad log-prob pass), the
    update the rest of the step (forward and backward of every micro-batch, the optimizer step)."""
    steps = counted(trl["steps"])
    figures = {
        "step_all": median(s["seconds"] for s in trl["steps"]),
        "step": median(s["seconds"] for s in steps),
        "generation": median(s["generate_seconds"] for s in steps),
        "update": median(s["seconds"] - s["generate_seconds"] for s in steps),
        "generation_tps": median(s["completion_tokens"] / s["generate_seconds"] for s in steps),
        "trained_tps": median(s["completion_tokens"] / (s["seconds"] - s["generate_seconds"]) for s in steps),
        "gpu_peak_gib": trl["gpu_peak_mib"] / 1024,
        "total": sum(s["seconds"] for s in trl["steps"]),
    }
    figures["mfu"] = mfu(figures["trained_tps"], parameters, peak_flops)
    return figures


def ratio_line(label: str, artweb: dict, trl: dict) -> str:
    """The report's last line: the ratio of the median step times over the counted steps."""
    return f"step-time ratio artweb / TRL ({label}): {artweb['step'] / trl['step']:.2f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _x(a: float, t: float) -> str:
    return f"{a / t:.2f}" if t else "n/a"


def summary_lines(a: dict, t: dict, words: str, steps: int) -> list[str]:
    """The side-by-side table of the two sides' figures."""
    return [
        "| | artweb | TRL | artweb / TRL |",
        "|---|---:|---:|---:|",
        f"| wall time per step, median of {words} (s) | {a['step']:.2f} | {t['step']:.2f} | **{_x(a['step'], t['step'])}** |",
        *(
            []
            if words == "all steps"
            else [
                f"| wall time per step, median of all steps (s) | {a['step_all']:.2f} | {t['step_all']:.2f} | "
                f"{_x(a['step_all'], t['step_all'])} |"
            ]
        ),
        f"| total of the {steps} steps (s) | {a['total']:.1f} | {t['total']:.1f} | {_x(a['total'], t['total'])} |",
        f"| generation: artweb rollouts phase / TRL generate+score, median (s) | {a['generation']:.2f} | "
        f"{t['generation']:.2f} | {_x(a['generation'], t['generation'])} |",
        f"| update: artweb train phase / TRL rest of the step, median (s) | {a['update']:.2f} | {t['update']:.2f} | "
        f"{_x(a['update'], t['update'])} |",
        f"| completion tokens/s in generation, median | {a['generation_tps']:,.0f} | {t['generation_tps']:,.0f} | |",
        f"| trained tokens/s in the update, median | {a['trained_tps']:,.0f} | {t['trained_tps']:,.0f} | |",
        f"| MFU of the update (6N per trained token) | {_pct(a['mfu'])} | {_pct(t['mfu'])} | |",
        f"| peak GPU memory in use (GiB, nvidia-smi) | {a['gpu_peak_gib']:.1f} | {t['gpu_peak_gib']:.1f} | |",
    ]


def per_step_lines(a_steps: list[dict], t_steps: list[dict]) -> list[str]:
    lines = [
        "| step | artweb s | artweb rollouts s | artweb train s | artweb reward | TRL s | TRL generate s | "
        "TRL update s | TRL reward |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    nan = float("nan")
    for i in range(max(len(a_steps), len(t_steps))):
        cells = [str(i + 1)]
        if i < len(a_steps):
            a = a_steps[i]
            reward = a.get("reward_mean")
            cells += [
                f"{a['seconds']:.2f}",
                f"{a['timings'].get('rollouts', nan):.2f}",
                f"{a['timings'].get('train', nan):.2f}",
                "" if reward is None else f"{reward:.3f}",
            ]
        else:
            cells += [""] * 4
        if i < len(t_steps):
            t = t_steps[i]
            cells += [
                f"{t['seconds']:.2f}",
                f"{t['generate_seconds']:.2f}",
                f"{t['seconds'] - t['generate_seconds']:.2f}",
                f"{t.get('reward_mean', nan):.3f}",
            ]
        else:
            cells += [""] * 4
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def phase_lines(a_steps: list[dict]) -> list[str]:
    return [
        "| " + " | ".join(PHASES) + " |",
        "|" + "---:|" * len(PHASES),
        "| " + " | ".join(f"{median(s['timings'].get(p) for s in a_steps):.2f}" for p in PHASES) + " |",
    ]


def trl_words(trl: dict, eager: str) -> str:
    """How TRL's side ran, from its result: vLLM's settings, the batching, checkpointing, the IS correction."""
    vllm = trl.get("vllm")
    if vllm is None:
        how = "generation with transformers (no vLLM: a dry run)"
    else:
        how = (
            f"vLLM {eager} in the trainer's process (colocate, {vllm['vllm_gpu_memory_utilization']:g} of the GPU's "
            f"memory, context {vllm.get('vllm_max_model_length')} tokens, sleep mode "
            f"{'on' if vllm.get('vllm_enable_sleep_mode') else 'off'}), merged weights pushed to it each step"
        )
    accumulation, micro = trl.get("gradient_accumulation_steps", 1), trl.get("micro_batch", "?")
    update = (
        f"the update in one pass over the step's {micro} sequences"
        if accumulation == 1
        else f"the update in {accumulation} micro-batches of {micro} sequences, gradients accumulated"
    )
    if vllm is None:
        correction = "not applied (no vLLM)"
    elif vllm.get("vllm_importance_sampling_correction", True):
        correction = "on (TRL's default: a no-grad log-prob pass over the step, in its generate+score time)"
    else:
        correction = "off"
    return (
        f"{how}; the step's {trl.get('generation_batch_size', '?')} completions generated in one batch, {update}, "
        f"gradient checkpointing {'on' if trl.get('gradient_checkpointing') else 'off'}, PEFT LoRA; importance-sampling "
        f"correction of the sampler's log-probs {correction}; its other GRPOConfig settings are TRL's defaults."
    )


def setting_lines(args, model: dict, trl: dict, meta: dict) -> list[str]:
    """What was run: the GPU and versions, the model and reward, the settings both sides share, each side's own."""
    eager = "eager" if args.eager else "with CUDA graphs"
    params = model.get("matmul_parameters")
    lines = [
        f"- GPU: {meta['versions'].get('gpu', 'none')}.",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if k != "gpu") + ".",
        f"- Command: `{meta['command']}`",
        f"- Model: {model['words']}"
        + (f"; N = {params / 1e6:,.0f}M weights a token is multiplied by (MFU)." if params else "."),
        f"- Reward (both): {model['reward_words']}",
        f"- Settings (both): {args.steps} steps, {args.scenarios_per_step} scenarios x group of {args.group_size} "
        f"per step (the scenarios an artweb run with seed 0 samples, the same on both sides), at most "
        f"{args.max_tokens} completion tokens, temperature 1, learning rate {args.learning_rate:g} constant, LoRA r=8 "
        "alpha 16 on all attention and MLP projections, AdamW (beta2 0.99, weight decay 0.1), gradient norm clip "
        "0.1, CISPO (ratio capped at 5), group-std advantage scaling, no KL, bf16 base weights, no validation, one "
        "optimizer step per step.",
        "- artweb: the Celery GPU worker (prefork, concurrency 1), ARTWEB_TRAINER_BACKEND=unsloth, "
        f"ARTWEB_VLLM_ADAPTER_MODE={getattr(args, 'adapter_mode', 'lora')}, vLLM {eager} in its own server process{model.get('artweb_words', '')}, "
        "rollouts in the sandbox "
        f"({meta['sandbox']}), PostgreSQL and Redis embedded; the engine's train defaults (no gradient "
        "checkpointing, micro-batches sized by the worker"
        + (f", micro_batch_tokens={args.micro_batch_tokens}" if getattr(args, "micro_batch_tokens", 0) else "")
        + "); the sampler's log-probs are the loss's old log-probs.",
        f"- TRL: `{trl['command']}`: {trl_words(trl, eager)}",
        "- Neither side's step 1 includes its start-up (artweb: the worker and vLLM server; TRL: the trainer "
        f"and its vLLM engine, {trl.get('setup_seconds', float('nan')):.0f} s); artweb's step 1 includes "
        "importing Unsloth and loading the model into the trainer (phase trainer_load).",
    ]
    return lines


def report(args, model: dict, artweb: dict, trl: dict, meta: dict) -> str:
    """The comparison as markdown, ending with the line `step-time ratio artweb / TRL (<label>): N.NN`."""
    parameters, peak = model.get("matmul_parameters"), peak_bf16_flops(meta["versions"].get("gpu"))
    a, t = artweb_figures(artweb, parameters, peak), trl_figures(trl, parameters, peak)
    words = counted_words(artweb["steps"])
    if counted_words(trl["steps"]) != words:
        words += " (TRL: " + counted_words(trl["steps"]) + ")"
    lines = [
        f"# artweb vs TRL GRPOTrainer (vLLM colocate) on one GPU: {model['label']} ({time.strftime('%Y-%m-%d')})",
        "",
        *setting_lines(args, model, trl, meta),
        "",
        "## Step time",
        "",
        *summary_lines(a, t, words, args.steps),
        "",
        f"Medians are of {words} unless said. MFU of the update: trained tokens/s of the update x 6N / the GPU's "
        "peak dense bf16 FLOP/s ("
        + (f"{peak / 1e12:,.0f} TFLOP/s" if peak else "not known for this GPU: n/a")
        + "); 6N per token is the full-training convention (forward 2N, backward 4N); a LoRA update skips the base "
        "weights' gradients, so its own work is nearer 4N, two-thirds of the figure; gradient checkpointing's "
        "recomputation, attention's FLOPs and the prompt tokens are not counted.",
        "",
        "## Per step",
        "",
        *per_step_lines(artweb["steps"], trl["steps"]),
        "",
        "## Where an artweb step's time goes (median s, all steps)",
        "",
        *phase_lines(artweb["steps"]),
        "",
        ratio_line(model["label"], a, t),
    ]
    return "\n".join(lines) + "\n"


def figures(model: dict, artweb: dict, trl: dict, meta: dict) -> dict:
    """The computed figures of both sides, for --json."""
    parameters, peak = model.get("matmul_parameters"), peak_bf16_flops(meta["versions"].get("gpu"))
    return {
        "artweb": artweb_figures(artweb, parameters, peak),
        "trl": trl_figures(trl, parameters, peak),
        "peak_bf16_flops": peak,
        "matmul_parameters": parameters,
        "flops_per_parameter": FLOPS_PER_PARAMETER,
        "counted": counted_words(artweb["steps"]),
    }
