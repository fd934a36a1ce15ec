"""Hugging Face TRL's GRPOTrainer on the example task: the other side of `bench.trl_compare`.

Runs in a process of its own, so its peak memory is its own. Two modes:

    python -m bench.trl_grpo train --steps 10 --out DIR      # GRPO steps with TRL's own generation
    python -m bench.trl_grpo update --batch FILE --out DIR   # TRL's loss + optimizer step on a given batch

On a GPU (`--device cuda`) it trains in bf16 and can generate with TRL's vLLM colocate mode
(`--generation vllm-colocate`: vLLM in the trainer's process, on the same GPU, the weights pushed to it
after every step); `--vllm-eager` starts that engine without CUDA graphs, as artweb's worker does with
ARTWEB_VLLM_ENFORCE_EAGER=1.

One optimizer step per artweb step: TRL's generation batch is the whole step (every completion of the step
generated in one vLLM call), and `--micro-batch N` runs its update in micro-batches of N sequences whose
gradients are accumulated (per_device_train_batch_size = N, gradient_accumulation_steps = the step's
sequences / N; 0: the whole step at once). `--reward FILE` scores completions with another reward file of
the `reward(trajectory, scenario)` form (default: the example task's).

Settings follow artweb's defaults one for one (see `grpo_config`): CISPO with its ratio capped at 5 (artweb's
ε_high = 4 around 1), rewards scaled by the group's standard deviation, no KL term, AdamW with
β2 = 0.99 and weight decay 0.1, gradient norm clipped at 0.1, a constant learning rate, LoRA on all
attention and MLP projections. Each step sees the scenarios an artweb run with the same seed samples.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.task import load_reward, load_scenarios, messages_for, train_schedule

GENERATION_MODES = ("transformers", "continuous-batching", "vllm-colocate")
VLLM_FIELDS = (
    "vllm_gpu_memory_utilization",
    "vllm_max_model_length",
    "vllm_enable_sleep_mode",
    "vllm_importance_sampling_correction",
)


def train_batching(group_size: int, scenarios_per_step: int, micro_batch: int) -> tuple[int, int]:
    """(per_device_train_batch_size, gradient_accumulation_steps) so that one optimizer step covers one artweb
    step of group_size x scenarios_per_step sequences in micro-batches of micro_batch (0: all at once)."""
    batch = group_size * scenarios_per_step
    micro = micro_batch or batch
    if micro < 1 or batch % micro:
        raise ValueError(
            f"the micro-batch ({micro_batch} sequences) must divide a step's {batch} sequences "
            f"({group_size} x {scenarios_per_step} scenarios): one of "
            + ", ".join(str(d) for d in range(1, batch + 1) if batch % d == 0)
        )
    return micro, batch // micro


def prompt_tokens_max(model_dir: Path, prompts: list[list[dict]]) -> int:
    """The longest of these chat prompts in the model's tokens, chat template and generation prompt included."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return max(
        len(tokenizer(text, add_special_tokens=False)["input_ids"])
        for text in {tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts}
    )


def vllm_context(prompt_tokens: int, max_tokens: int, sequences: int) -> int:
    """vLLM's context for TRL's engine: the longest prompt and a whole completion, 64 tokens to spare for how TRL
    renders the prompt; at least 4,096 / the step's sequences, as vLLM wants its batch of sequences (TRL's
    max_num_seqs) to hold TRL's 4,096-token scheduling budget (max_num_batched_tokens)."""
    return max(prompt_tokens + max_tokens + 64, -(-4096 // sequences))


def vllm_settings(args) -> dict:
    """GRPOConfig's settings of the colocated vLLM engine: its share of the GPU, its context (`train` sets it to
    hold the longest prompt and a whole completion; unset, vLLM sizes it from the model's config), sleep mode,
    and TRL's importance-sampling correction of the sampler's log-probs (TRL's default: on). Callers that build
    their own namespace without the newer options get TRL's defaults for them."""
    return {
        "vllm_gpu_memory_utilization": args.vllm_memory,
        "vllm_max_model_length": getattr(args, "vllm_max_model_length", 0) or None,
        "vllm_enable_sleep_mode": getattr(args, "vllm_sleep_mode", False),
        "vllm_importance_sampling_correction": getattr(args, "vllm_is_correction", "on") == "on",
    }


def grpo_config(args, out_dir: Path):
    import torch
    from trl import GRPOConfig

    from training.engine.backends import resolve_dtype

    dtype = resolve_dtype(args.dtype, args.device)
    micro, accumulation = train_batching(args.group_size, args.scenarios_per_step, getattr(args, "micro_batch", 0))
    extra = {}
    if args.gradient_checkpointing != "trl-default":  # TRL's default is on; artweb's engine's is off
        extra["gradient_checkpointing"] = args.gradient_checkpointing == "on"
    if args.generation == "vllm-colocate":
        extra.update(vllm_settings(args))
    return GRPOConfig(
        output_dir=str(out_dir),
        max_steps=args.steps,
        seed=args.seed,
        use_cpu=args.device == "cpu",
        bf16=dtype == torch.bfloat16,
        model_init_kwargs={"dtype": dtype},
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        # One generation per optimizer step: every completion of the step in one batch (TRL derives
        # steps_per_generation = gradient_accumulation_steps from it).
        generation_batch_size=args.group_size * args.scenarios_per_step,
        num_generations=args.group_size,
        max_completion_length=args.max_tokens,
        shuffle_dataset=False,
        temperature=1.0,
        top_p=1.0,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.1,
        adam_beta1=0.9,
        adam_beta2=0.99,
        adam_epsilon=1e-8,
        max_grad_norm=0.1,
        beta=0.0,
        loss_type="cispo",
        epsilon_high=5.0,
        scale_rewards="group",
        num_iterations=1,
        use_transformers_continuous_batching=args.generation == "continuous-batching",
        use_vllm=args.generation == "vllm-colocate",
        vllm_mode="colocate",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
        **extra,
    )


def vllm_without_cuda_graphs() -> None:
    """Make TRL's colocated vLLM engine start eagerly (no torch.compile, no CUDA graph capture)."""
    import functools

    from trl.generation import vllm_generation

    vllm_generation.LLM = functools.partial(vllm_generation.LLM, enforce_eager=True)


def lora_config(rank: int):
    from peft import LoraConfig

    from training.engine.config import DEFAULT_LORA_TARGETS

    return LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        lora_dropout=0.0,
        target_modules=list(DEFAULT_LORA_TARGETS),
        bias="none",
        task_type="CAUSAL_LM",
    )


def make_dataset(args):
    """One row per scenario, in the order artweb's steps sample them; TRL repeats each row group_size times."""
    from datasets import Dataset

    schedule = train_schedule(load_scenarios()["train"], args.steps, args.scenarios_per_step, args.seed)
    return Dataset.from_list(
        [{"prompt": messages_for(s), "scenario": json.dumps(s)} for step in schedule for s in step]
    )


def make_prompts(args) -> list[list[dict]]:
    """The chat prompts of the run's steps (make_dataset's prompt column)."""
    schedule = train_schedule(load_scenarios()["train"], args.steps, args.scenarios_per_step, args.seed)
    return [messages_for(s) for step in schedule for s in step]


def make_reward_func(path: Path | None = None):
    """TRL's reward function from a reward file of artweb's form, `reward(trajectory, scenario)` (default: the
    example task's): each completion is scored as artweb scores a trajectory whose messages are the prompt and
    that answer (bench.task.load_reward)."""
    score = load_reward(path) if path else load_reward()

    def example_reward(prompts, completions, scenario, **_):
        return [
            score(json.loads(s), c[-1]["content"] if isinstance(c, list) else c)
            for s, c in zip(scenario, completions, strict=False)
        ]

    return example_reward


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def train(args) -> dict:
    import torch
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    torch.manual_seed(args.seed)
    if args.generation == "vllm-colocate":
        if args.vllm_eager:
            vllm_without_cuda_graphs()
        if not args.vllm_max_model_length:
            longest = prompt_tokens_max(args.model_dir, make_prompts(args))
            args.vllm_max_model_length = vllm_context(
                longest, args.max_tokens, args.group_size * args.scenarios_per_step
            )
    steps: list[dict] = []

    class Timed(GRPOTrainer):
        """Times generation + scoring apart from the rest of each step."""

        def _generate_and_score_completions(self, inputs):
            t = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            steps.append(
                {"generate_seconds": time.perf_counter() - t, "completion_tokens": int(out["completion_mask"].sum())}
            )
            return out

    class Clock(TrainerCallback):
        def on_step_begin(self, _args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, _args, state, control, **kw):
            steps[-1]["seconds"] = time.perf_counter() - self.t
            steps[-1]["ended_at"] = time.time()
            steps[-1]["step"] = state.global_step

        def on_log(self, _args, state, control, logs=None, **kw):
            if logs and "reward" in logs and steps:
                steps[-1]["reward_mean"] = logs["reward"]

    started = time.perf_counter()
    trainer = Timed(
        model=str(args.model_dir),
        reward_funcs=[make_reward_func(args.reward)],
        args=grpo_config(args, args.out / "trl-out"),
        train_dataset=make_dataset(args),
        peft_config=lora_config(args.lora_rank),
        callbacks=[Clock()],
    )
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    adapter = args.out / "trl-adapter"
    trainer.model.save_pretrained(str(adapter))
    return {
        "steps": steps,
        "wall_seconds": wall,
        "setup_seconds": t0 - started,
        "peak_rss_gb": peak_rss_gb(),
        **gpu_peaks(),
        "adapter": str(adapter),
        "generation": args.generation,
        "gradient_checkpointing": bool(trainer.args.gradient_checkpointing),
        "micro_batch": trainer.args.per_device_train_batch_size,
        "gradient_accumulation_steps": trainer.args.gradient_accumulation_steps,
        "generation_batch_size": trainer.args.generation_batch_size,
        "vllm": {k: getattr(trainer.args, k) for k in VLLM_FIELDS} if trainer.args.use_vllm else None,
        "reward_file": str(args.reward) if args.reward else "example",
        "torch_threads": torch.get_num_threads(),
    }


def gpu_peaks() -> dict:
    """The peak GPU memory PyTorch's allocator held in this process (GiB), where there is a GPU."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {
        "gpu_peak_allocated_gb": torch.cuda.max_memory_allocated() / 2**30,
        "gpu_peak_reserved_gb": torch.cuda.max_memory_reserved() / 2**30,
    }


def update(args) -> dict:
    """TRL's compute_loss + backward + clipped AdamW step on the batch in args.batch, timed."""
    import torch
    from trl import GRPOTrainer

    batch = json.loads(Path(args.batch).read_text())
    trainer = GRPOTrainer(
        model=str(args.model_dir),
        reward_funcs=[make_reward_func(args.reward)],
        args=grpo_config(args, args.out / "trl-update"),
        train_dataset=make_dataset(args),
        peft_config=lora_config(args.lora_rank),
    )
    trainer.create_optimizer_and_scheduler(num_training_steps=args.repeats + 1)
    trainer.current_gradient_accumulation_steps = 1
    model = trainer.model
    model.train()
    device = trainer.accelerator.device
    inputs = {k: v.to(device) for k, v in _tensors(batch, trainer.processing_class.pad_token_id).items()}
    params = [p for p in model.parameters() if p.requires_grad]
    times = []
    for _ in range(args.repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        with trainer.compute_loss_context_manager():
            loss = trainer.compute_loss(model, inputs)
        trainer.accelerator.backward(loss)
        torch.nn.utils.clip_grad_norm_(params, 0.1)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    trained = int(inputs["completion_mask"].sum())
    median = statistics.median(times[1:])
    return {
        "update_seconds": times[1:],
        "median_seconds": median,
        "tokens_trained": trained,
        "trained_tokens_per_second": trained / median,
        "peak_rss_gb": peak_rss_gb(),
    }


def batch_of(trainer, groups: list[list[dict]]) -> dict:
    """The sequences artweb's trainer would train on `groups`, as the prompt ids, completion ids and
    advantages that `update --batch` reads."""
    from training.engine.advantages import compute_advantages

    adv = compute_advantages(groups)
    batch = {"prompt_ids": [], "completion_ids": [], "advantages": []}
    for s in trainer.tokenize_groups(groups, adv.values, adv.used):
        if s.n_trainable == 0:
            continue
        first = s.trainable.index(True)
        last = len(s.trainable) - s.trainable[::-1].index(True)
        batch["prompt_ids"].append(s.input_ids[:first])
        batch["completion_ids"].append(s.input_ids[first:last])
        batch["advantages"].append(s.advantage)
    return batch


def _tensors(batch: dict, pad_id: int) -> dict:
    """Left-padded prompts, right-padded completions, the way TRL lays out a generation batch."""
    import torch

    prompts, completions = batch["prompt_ids"], batch["completion_ids"]
    p_len, c_len = max(map(len, prompts)), max(map(len, completions))
    prompt_ids = torch.tensor([[pad_id] * (p_len - len(p)) + p for p in prompts])
    prompt_mask = torch.tensor([[0] * (p_len - len(p)) + [1] * len(p) for p in prompts])
    completion_ids = torch.tensor([c + [pad_id] * (c_len - len(c)) for c in completions])
    completion_mask = torch.tensor([[1] * len(c) + [0] * (c_len - len(c)) for c in completions])
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor(batch["advantages"]),
        "num_items_in_batch": completion_mask.sum(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["train", "update"])
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--group-size", type=int, default=6)
    p.add_argument("--scenarios-per-step", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--learning-rate", type=float, default=2e-4)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--generation", choices=GENERATION_MODES, default="transformers")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float32"],
        default="auto",
        help="the model's weights; auto: the benchmark's rule (bf16 where the processor has bf16 units)",
    )
    p.add_argument(
        "--gradient-checkpointing",
        choices=["trl-default", "on", "off"],
        default="trl-default",
        help="off matches artweb's engine; TRL's GRPOConfig turns it on by default",
    )
    p.add_argument(
        "--reward", type=Path, help="a reward file with reward(trajectory, scenario) (default: the example's)"
    )
    p.add_argument(
        "--micro-batch",
        type=int,
        default=0,
        help="sequences per forward/backward pass, accumulated over the step (0: the whole step at once)",
    )
    p.add_argument("--vllm-eager", action="store_true", help="vllm-colocate: no CUDA graphs (faster start)")
    p.add_argument("--vllm-memory", type=float, default=0.3, help="vllm-colocate: share of the GPU's memory for vLLM")
    p.add_argument(
        "--vllm-max-model-length",
        type=int,
        default=0,
        help="vllm-colocate: vLLM's context (0: the longest prompt + --max-tokens + 64 tokens)",
    )
    p.add_argument(
        "--vllm-sleep-mode",
        action="store_true",
        help="vllm-colocate: free vLLM's weights and KV cache during the update (less memory, slower steps)",
    )
    p.add_argument(
        "--vllm-is-correction",
        choices=["on", "off"],
        default="on",
        help="vllm-colocate: TRL's importance-sampling correction of vLLM's log-probs (TRL's default: on)",
    )
    p.add_argument("--batch", type=Path, help="update mode: JSON with prompt_ids, completion_ids, advantages")
    p.add_argument("--repeats", type=int, default=3, help="update mode: timed updates after one warm-up")
    args = p.parse_args(argv)
    try:
        train_batching(args.group_size, args.scenarios_per_step, args.micro_batch)
    except ValueError as e:
        p.error(f"--micro-batch: {e}")
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = train(args) if args.mode == "train" else update(args)
    (args.out / f"trl-{args.mode}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
