"""Benchmark of one GRPO update: trained tokens per second and peak memory.

Synthetic groups (a short chat prompt, random completion tokens, random rewards) go through the real
trainer, so tokenization, micro-batching, the loss and the optimizer step are all timed. "Trained tokens"
are the sampled completion tokens that carry a loss; prompt tokens are processed but not counted.

    python -m bench.engine_bench                                  # CPU, peft, the default model
    python -m bench.engine_bench --backend unsloth --device cuda --random-weights CONFIG_DIR
    python -m bench.engine_bench --backend unsloth --device cuda --shape qwen2.5-1.5b --tokenizer DIR

--random-weights builds a model with random weights from the config.json (and tokenizer) in a folder;
--shape builds one of the named shapes below in code. Either way it is saved to a temporary folder and
loaded from there like any model.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from training.engine import TrainConfig, make_trainer

# Architectures of public models, for benchmarking at their size without their weights.
SHAPES = {
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                         max_position_embeddings=32768, rope_theta=1_000_000.0, tie_word_embeddings=True),
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         max_position_embeddings=32768, rope_theta=1_000_000.0, tie_word_embeddings=True),
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


def synthetic_groups(tokenizer, n_groups: int, group_size: int, prompt_words: int, completion_tokens: int,
                     rng: random.Random) -> list[list[dict]]:
    """Groups of trajectories whose completions are random non-special tokens ending in EOS."""
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    groups = []
    for g in range(n_groups):
        prompt = f"Task {g}: " + " ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(prompt_words))
        group = []
        for _ in range(group_size):
            ids = [rng.choice(vocab) for _ in range(completion_tokens - 1)] + [tokenizer.eos_token_id]
            turn = {"role": "assistant", "content": "", "token_ids": ids,
                    "logprobs": [-rng.uniform(0.5, 3.0) for _ in ids]}
            group.append({"messages": [{"role": "user", "content": prompt}, turn], "reward": rng.random()})
        groups.append(group)
    return groups


def peak_memory_gb(device: str) -> dict[str, float]:
    if device.startswith("cuda"):
        return {"peak_gpu_allocated_gb": torch.cuda.max_memory_allocated() / 2**30,
                "peak_gpu_reserved_gb": torch.cuda.max_memory_reserved() / 2**30}
    return {"peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def profile_update(trainer, args, rng: random.Random) -> None:
    """One more update under torch.profiler; the table shows where its time goes, kernel by kernel."""
    from torch.profiler import ProfilerActivity, profile

    groups = synthetic_groups(trainer.tokenizer, args.groups, args.group_size, args.prompt_words,
                              args.completion_tokens, rng)
    cuda = args.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        trainer.train_step(groups)
        if cuda:
            torch.cuda.synchronize()
    sort = "cuda_time_total" if cuda else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=60), flush=True)


def resume_check(trainer, cfg: TrainConfig, model_dir: Path, args, rng: random.Random, ck: Path) -> dict:
    """Save, reload in a fresh trainer, compare adapters bit for bit, and train once more."""
    info = trainer.save_checkpoint(str(ck))
    saved = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.close()
    again = make_trainer(cfg, base_model_path=str(model_dir), device=args.device)
    again.load(str(ck))
    loaded = {n: p.detach() for n, p in again.model.named_parameters() if p.requires_grad}
    identical = saved.keys() == loaded.keys() and all(torch.equal(saved[n], loaded[n]) for n in saved)
    groups = synthetic_groups(again.tokenizer, args.groups, args.group_size, args.prompt_words,
                              args.completion_tokens, rng)
    m = again.train_step(groups)
    print(f"resumed at step {info['step']}: adapter identical {identical}, next update loss {m['loss']:.4f}, "
          f"step now {again.step}; checkpoint {info['size_bytes'] / 2**20:.1f} MiB "
          f"{sorted(p.name for p in ck.iterdir())}", flush=True)
    again.close()
    return {"checkpoint_mib": round(info["size_bytes"] / 2**20, 2), "resume_identical": identical,
            "resumed_step": again.step}


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
    p.add_argument("--steps", type=int, default=3, help="timed updates")
    p.add_argument("--warmup", type=int, default=1, help="untimed updates first (allocations, compilation)")
    p.add_argument("--micro-batch-tokens", type=int, default=8192)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--no-entropy", action="store_true")
    p.add_argument("--profile", action="store_true", help="profile one more update; print the top kernels")
    p.add_argument("--resume-check", action="store_true",
                   help="after the timed updates: save a checkpoint, load it in a new trainer, update once more")
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

    cfg = TrainConfig(backend=args.backend, dtype=args.dtype, lora_rank=args.lora_rank,
                      lora_alpha=2.0 * args.lora_rank, micro_batch_tokens=args.micro_batch_tokens,
                      gradient_checkpointing=args.gradient_checkpointing, compute_entropy=not args.no_entropy,
                      learning_rate=1e-5)
    t0 = time.perf_counter()
    trainer = make_trainer(cfg, base_model_path=str(model_dir), device=args.device)
    trainer.load(None)
    load_seconds = time.perf_counter() - t0
    rng = random.Random(0)
    runs = []
    for i in range(args.warmup + args.steps):
        groups = synthetic_groups(trainer.tokenizer, args.groups, args.group_size, args.prompt_words,
                                  args.completion_tokens, rng)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        m = trainer.train_step(groups)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        label = "warmup" if i < args.warmup else "timed"
        print(f"{label} update: {m['tokens_trained']} trained / {m['tokens_processed']} processed tokens "
              f"in {m['train_seconds']:.3f} s (tokenize {m['tokenize_seconds']:.3f} s), loss {m['loss']:.4f}, grad_norm {m['grad_norm']:.4f}", flush=True)
        if i >= args.warmup:
            runs.append(m)
    seconds = sum(m["train_seconds"] for m in runs)
    result = {
        "backend": args.backend, "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "model": args.shape or (args.random_weights.name if args.random_weights else model_dir.name),
        "random_weights": bool(args.random_weights or args.shape),
        "lora_rank": args.lora_rank, "dtype": args.dtype, "threads": torch.get_num_threads(),
        "sequences_per_update": args.groups * args.group_size,
        "completion_tokens": args.completion_tokens,
        "micro_batch_tokens": args.micro_batch_tokens,
        "gradient_checkpointing": args.gradient_checkpointing,
        "load_seconds": round(load_seconds, 2),
        "seconds_per_update": round(seconds / len(runs), 4),
        "trained_tokens_per_second": round(sum(m["tokens_trained"] for m in runs) / seconds, 1),
        "processed_tokens_per_second": round(sum(m["tokens_processed"] for m in runs) / seconds, 1),
        **{k: round(v, 3) for k, v in peak_memory_gb(args.device).items()},
    }
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
