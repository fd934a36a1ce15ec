"""Benchmark of one GRPO update: trained tokens per second and peak memory.

Synthetic groups (a short chat prompt, random completion tokens, random rewards) go through the real
trainer, so tokenization, micro-batching, the loss and the optimizer step are all timed. "Trained tokens"
are the sampled completion tokens that carry a loss; prompt tokens are processed but not counted.

    python -m bench.engine_bench                                  # CPU, peft, the default model
    python -m bench.engine_bench --padded                         # the same batches, padded rows
    python -m bench.engine_bench --backend unsloth --device cuda --random-weights CONFIG_DIR
    python -m bench.engine_bench --backend unsloth --device cuda --shape qwen2.5-1.5b --tokenizer DIR

--random-weights builds a model with random weights from the config.json (and tokenizer) in a folder;
--shape builds one of the named shapes below in code. Either way it is saved to a temporary folder and
loaded from there like any model.

Micro-batches are packed (each group's prompt once, no padding) unless --padded asks for the layout
before packing; the seed fixes the batches, so the two runs train on identical data.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from training.engine.config import TrainConfig
from training.engine.trainer import make_trainer

# Architectures of public models, for benchmarking at their size without their weights.
SHAPES = {
    "qwen2.5-1.5b": {
        "model_type": "qwen2",
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": True,
    },
    "qwen2.5-0.5b": {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": True,
    },
}


def default_model_dir() -> Path:
    return Path(os.environ.get("ARTWEB_DATA_DIR", REPO / "data")) / "models" / "SmolLM2-135M-Instruct"


def build_random_model(out: Path, tokenizer_dir: Path, config_dir: Path | None, shape: str | None) -> Path:
    """Save a random-weight bf16 model (and tokenizer_dir's tokenizer) to out; return out."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if shape:
        spec = dict(SHAPES[shape])
        config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    else:
        config = AutoConfig.from_pretrained(config_dir)
    config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(0)
    # Random init of a billion parameters takes minutes on a few CPU cores and seconds on a GPU.
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"built random-weight model: {n_params / 1e6:.0f}M parameters", flush=True)
    return out


def synthetic_groups(
    tokenizer,
    n_groups: int,
    group_size: int,
    prompt_words: int,
    completion_tokens: int,
    rng: random.Random,
    completion_min_tokens: int | None = None,
) -> list[list[dict]]:
    """Groups of trajectories whose completions are random non-special tokens ending in EOS, each
    completion_tokens long, or of a length drawn uniformly from [completion_min_tokens, completion_tokens]."""
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    groups = []
    for g in range(n_groups):
        prompt = f"Task {g}: " + " ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(prompt_words))
        group = []
        for _ in range(group_size):
            n = rng.randint(completion_min_tokens, completion_tokens) if completion_min_tokens else completion_tokens
            ids = [rng.choice(vocab) for _ in range(n - 1)] + [tokenizer.eos_token_id]
            turn = {
                "role": "assistant",
                "content": "",
                "token_ids": ids,
                "logprobs": [-rng.uniform(0.5, 3.0) for _ in ids],
            }
            group.append({"messages": [{"role": "user", "content": prompt}, turn], "reward": rng.random()})
        groups.append(group)
    return groups


def cpu_model() -> str:
    """The processor's model name, as /proc/cpuinfo (Linux) or the platform module gives it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def peak_memory_gb(device: str) -> dict[str, float]:
    if device.startswith("cuda"):
        return {
            "peak_gpu_allocated_gb": torch.cuda.max_memory_allocated() / 2**30,
            "peak_gpu_reserved_gb": torch.cuda.max_memory_reserved() / 2**30,
        }
    return {"peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def profile_update(trainer, args, rng: random.Random) -> None:
    """One more update under torch.profiler; the table shows where its time goes, kernel by kernel."""
    from torch.profiler import ProfilerActivity, profile

    groups = synthetic_groups(
        trainer.tokenizer,
        args.groups,
        args.group_size,
        args.prompt_words,
        args.completion_tokens,
        rng,
        args.completion_min_tokens,
    )
    cuda = args.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        trainer.train_step(groups)
        if cuda:
            torch.cuda.synchronize()
    sort = "cuda_time_total" if cuda else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=60), flush=True)


def timed_update(trainer, groups: list[list[dict]], device: str) -> dict:
    """train_step's metrics plus cpu_seconds: CPU time of this process, which on a machine shared with
    other work varies less than wall time."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    cpu_start = time.process_time()
    m = trainer.train_step(groups)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    m["cpu_seconds"] = time.process_time() - cpu_start
    return m


def summary(trainer, runs: list[dict]) -> dict:
    """Per-update figures of one layout's timed updates."""
    return {
        "layout": "packed" if trainer.packed else "padded",
        "median_seconds_per_update": round(statistics.median(m["train_seconds"] for m in runs), 4),
        "min_seconds_per_update": round(min(m["train_seconds"] for m in runs), 4),
        "cpu_seconds_per_update": round(sum(m["cpu_seconds"] for m in runs) / len(runs), 3),
        "tokens_processed_per_update": round(sum(m["tokens_processed"] for m in runs) / len(runs), 1),
        "loss_mean": sum(m["loss"] for m in runs) / len(runs),
    }


def resume_check(trainer, cfg: TrainConfig, model_dir: Path, args, rng: random.Random, ck: Path) -> dict:
    """Save, reload in a fresh trainer, compare adapters bit for bit, and train once more."""
    info = trainer.save_checkpoint(str(ck))
    saved = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.close()
    again = make_trainer(cfg, base_model_path=str(model_dir), device=args.device, packed=trainer.packed)
    again.load(str(ck))
    loaded = {n: p.detach() for n, p in again.model.named_parameters() if p.requires_grad}
    identical = saved.keys() == loaded.keys() and all(torch.equal(saved[n], loaded[n]) for n in saved)
    groups = synthetic_groups(
        again.tokenizer,
        args.groups,
        args.group_size,
        args.prompt_words,
        args.completion_tokens,
        rng,
        args.completion_min_tokens,
    )
    m = again.train_step(groups)
    print(
        f"resumed at step {info['step']}: adapter identical {identical}, next update loss {m['loss']:.4f}, "
        f"step now {again.step}; checkpoint {info['size_bytes'] / 2**20:.1f} MiB "
        f"{sorted(p.name for p in ck.iterdir())}",
        flush=True,
    )
    again.close()
    return {
        "checkpoint_mib": round(info["size_bytes"] / 2**20, 2),
        "resume_identical": identical,
        "resumed_step": again.step,
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="peft", choices=["peft", "unsloth"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", type=Path, default=None, help="model folder (default: the default model)")
    p.add_argument("--random-weights", type=Path, default=None, help="config folder: build random weights")
    p.add_argument("--shape", choices=sorted(SHAPES), default=None, help="named shape: build random weights")
    p.add_argument("--tokenizer", type=Path, default=None, help="tokenizer folder for --shape")
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--group-size", type=int, default=6)
    p.add_argument("--prompt-words", type=int, default=8)
    p.add_argument("--completion-tokens", type=int, default=48)
    p.add_argument(
        "--completion-min-tokens",
        type=int,
        default=None,
        help="draw each completion's length from [this, --completion-tokens] (default: all full length)",
    )
    p.add_argument("--steps", type=int, default=3, help="timed updates")
    p.add_argument("--warmup", type=int, default=1, help="untimed updates first (allocations, compilation)")
    p.add_argument("--micro-batch-tokens", type=int, default=8192)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--no-entropy", action="store_true")
    p.add_argument(
        "--padded",
        action="store_true",
        help="pad micro-batches to their longest row instead of packing them (for comparison)",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="also train a padded trainer on the same batches, alternating, and report both",
    )
    p.add_argument("--profile", action="store_true", help="profile one more update; print the top kernels")
    p.add_argument(
        "--resume-check",
        action="store_true",
        help="after the timed updates: save a checkpoint, load it in a new trainer, update once more",
    )
    p.add_argument("--json-out", type=Path, default=None)
    args = p.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.backend == "unsloth":
        import unsloth  # noqa: F401  (it patches transformers, so it goes first)
    tmp = tempfile.TemporaryDirectory()
    model_dir = args.model or default_model_dir()
    if args.random_weights or args.shape:
        tok_dir = args.tokenizer or args.random_weights
        model_dir = build_random_model(Path(tmp.name), tok_dir, args.random_weights, args.shape)

    cfg = TrainConfig(
        backend=args.backend,
        dtype=args.dtype,
        lora_rank=args.lora_rank,
        lora_alpha=2.0 * args.lora_rank,
        micro_batch_tokens=args.micro_batch_tokens,
        gradient_checkpointing=args.gradient_checkpointing,
        compute_entropy=not args.no_entropy,
        learning_rate=1e-5,
    )
    t0 = time.perf_counter()
    print(f"cpu: {cpu_model()}, {torch.get_num_threads()} torch threads", flush=True)
    trainer = make_trainer(
        cfg, base_model_path=str(model_dir), device=args.device, packed=False if args.padded else None
    )
    trainer.load(None)
    load_seconds = time.perf_counter() - t0
    rng = random.Random(0)
    # --compare: a second trainer, padded, trains on every batch too (the two alternate which goes
    # first), so load from other work on the machine falls on both alike.
    other = None
    if args.compare:
        other = make_trainer(cfg, base_model_path=str(model_dir), device=args.device, packed=not trainer.packed)
        other.load(None)
    runs, other_runs = [], []
    for i in range(args.warmup + args.steps):
        groups = synthetic_groups(
            trainer.tokenizer,
            args.groups,
            args.group_size,
            args.prompt_words,
            args.completion_tokens,
            rng,
            args.completion_min_tokens,
        )
        order = [(trainer, runs), (other, other_runs)][:: 1 if i % 2 == 0 else -1]
        for t, into in order:
            if t is None:
                continue
            m = timed_update(t, groups, args.device)
            label = "warmup" if i < args.warmup else "timed"
            print(
                f"{label} update ({'packed' if t.packed else 'padded'}): {m['tokens_trained']} trained / "
                f"{m['tokens_processed']} processed tokens in {m['train_seconds']:.3f} s "
                f"({m['cpu_seconds']:.2f} CPU s; tokenize {m['tokenize_seconds']:.3f} s), loss {m['loss']:.4f}, "
                f"grad_norm {m['grad_norm']:.4f}",
                flush=True,
            )
            if i >= args.warmup:
                into.append(m)
    seconds = sum(m["train_seconds"] for m in runs)
    result = {
        "backend": args.backend,
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else cpu_model(),
        **{k: v for k, v in summary(trainer, runs).items() if k != "loss_mean"},
        "model": args.shape or (args.random_weights.name if args.random_weights else model_dir.name),
        "random_weights": bool(args.random_weights or args.shape),
        "lora_rank": args.lora_rank,
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "sequences_per_update": args.groups * args.group_size,
        "completion_tokens": args.completion_tokens,
        "completion_min_tokens": args.completion_min_tokens,
        "micro_batch_tokens": args.micro_batch_tokens,
        "gradient_checkpointing": args.gradient_checkpointing,
        "load_seconds": round(load_seconds, 2),
        "seconds_per_update": round(seconds / len(runs), 4),
        "trained_tokens_per_second": round(sum(m["tokens_trained"] for m in runs) / seconds, 1),
        "processed_tokens_per_second": round(sum(m["tokens_processed"] for m in runs) / seconds, 1),
        "tokens_trained_per_update": round(sum(m["tokens_trained"] for m in runs) / len(runs), 1),
        **{k: round(v, 3) for k, v in peak_memory_gb(args.device).items()},
    }
    if other is not None:
        result["compared"] = summary(other, other_runs)
        result["speedup_median"] = round(
            result["compared"]["median_seconds_per_update"] / result["median_seconds_per_update"], 2
        )
        other.close()
    if args.profile:
        profile_update(trainer, args, rng)
    if args.resume_check:
        result.update(resume_check(trainer, cfg, model_dir, args, rng, Path(tmp.name) / "checkpoint"))
    print(json.dumps(result), flush=True)
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2))
    trainer.close()
    tmp.cleanup()
    return result


if __name__ == "__main__":
    main()
