"""Does artweb's update move the LoRA weights exactly as TRL's GRPOTrainer does, on the same data?

Both trainers start from one set of adapter weights (LoRA B drawn at random too, so every weight gets a
gradient from the first update) and see the same batch: the example task's first-step scenarios, a group
of answers each sampled from that policy with transformers `generate`, scored by the example reward.
Then, `--updates` times: artweb's `train_step` (its sampler log-probs refreshed from the current policy,
as a fresh on-policy batch would bring them) beside TRL's `compute_loss`, backward, gradient-norm clip
and optimizer step. Printed: the first update's gradients (cosine, norms) and, after each update, how far
each side's weights have moved from the start and the cosine between the two moves.

    python -m bench.update_equivalence                # fp32, 5 updates
    python -m bench.update_equivalence --updates 10

Needs TRL (`pip install -e '.[bench]'`). A cosine of 1 to six digits and equal norms mean the two
updates are one and the same; a held-out reward gap between the two trainers then comes from the
answers they sampled, not from the update.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.task import load_reward, load_scenarios, messages_for, train_schedule


def sample_groups(trainer, group_size: int, max_tokens: int, seed: int) -> list[list[dict]]:
    """Step 1's scenarios, group_size answers each from the trainer's current policy, scored; trajectories
    in the form the step loop hands to the trainer (the sampler's log-probs filled in by the caller)."""
    import torch

    tok, model = trainer.tokenizer, trainer.model
    score = load_reward()
    torch.manual_seed(seed)
    groups = []
    model.eval()
    for scenario in train_schedule(load_scenarios()["train"], 1, 4, seed)[0]:
        prompt = tok.apply_chat_template(messages_for(scenario), add_generation_prompt=True, tokenize=False)
        ids = tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids.repeat(group_size, 1)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_tokens,
                pad_token_id=tok.eos_token_id,
            )
        group = []
        for row in out[:, ids.shape[1] :].tolist():
            if tok.eos_token_id in row:
                row = row[: row.index(tok.eos_token_id) + 1]
            text = tok.decode(row, skip_special_tokens=True)
            answer = {"role": "assistant", "content": text, "token_ids": row, "logprobs": [0.0] * len(row)}
            group.append({"messages": [*messages_for(scenario), answer], "reward": score(scenario, text)})
        groups.append(group)
    model.train()
    return groups


def refresh_logprobs(trainer, groups: list[list[dict]]) -> None:
    """The sampler's log-probs of every answer set to the current policy's: the batch is on-policy."""
    flat = [t for group in groups for t in group]
    for trajectory, logprobs in zip(flat, trainer.logprobs(flat), strict=True):
        trajectory["messages"][-1]["logprobs"] = logprobs


def compare(a: dict, b: dict) -> tuple[float, float, float]:
    """Cosine between two sets of tensors taken as one vector, and the two norms."""
    dot = na = nb = 0.0
    for name, x in a.items():
        y = b[name]
        dot += float((x * y).sum())
        na += float((x * x).sum())
        nb += float((y * y).sum())
    return dot / math.sqrt(na * nb), math.sqrt(na), math.sqrt(nb)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, default=REPO / "data" / "models" / "SmolLM2-135M-Instruct")
    p.add_argument("--updates", type=int, default=5)
    p.add_argument("--learning-rate", type=float, default=2e-4)
    p.add_argument("--group-size", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    args = p.parse_args(argv)

    import torch
    from trl import GRPOTrainer

    from bench import trl_grpo
    from training.engine.config import TrainConfig
    from training.engine.trainer import make_trainer

    def artweb_trainer():
        t = make_trainer(
            TrainConfig(learning_rate=args.learning_rate, dtype="float32"), base_model_path=str(args.model_dir)
        )
        t.load(None)
        return t

    ours = artweb_trainer()
    gen = torch.Generator().manual_seed(args.seed + 1)
    with torch.no_grad():
        for name, param in ours.model.named_parameters():
            if "lora_B" in name:  # zero at initialisation; random here so lora_A gets a gradient too
                param.copy_(torch.randn(param.shape, generator=gen) * 0.01)
    start = {n: p.detach().clone() for n, p in ours.model.named_parameters() if p.requires_grad}
    groups = sample_groups(ours, args.group_size, args.max_tokens, args.seed)
    refresh_logprobs(ours, groups)
    batch = trl_grpo.batch_of(ours, groups)
    trained = sum(map(len, batch["completion_ids"]))
    print(f"batch: {len(batch['advantages'])} answers, {trained} trained tokens", flush=True)

    # The first update's gradient, before clipping, on both sides.
    ours_grad: dict = {}
    clip = torch.nn.utils.clip_grad_norm_

    def keep_gradients(params, max_norm, *rest, **kw):
        ours_grad.update({n: p.grad.detach().clone() for n, p in ours.model.named_parameters() if p.grad is not None})
        return clip(params, max_norm, *rest, **kw)

    torch.nn.utils.clip_grad_norm_ = keep_gradients
    try:
        ours.train_step(groups)
    finally:
        torch.nn.utils.clip_grad_norm_ = clip

    ns = argparse.Namespace(
        model_dir=args.model_dir,
        steps=1,
        group_size=args.group_size,
        scenarios_per_step=4,
        max_tokens=args.max_tokens,
        learning_rate=args.learning_rate,
        lora_rank=8,
        seed=args.seed,
        generation="transformers",
        device="cpu",
        dtype="float32",
        gradient_checkpointing="off",
        vllm_memory=0.3,
    )
    work = Path(tempfile.mkdtemp(prefix="artweb-equivalence-"))
    trl = GRPOTrainer(
        model=str(args.model_dir),
        reward_funcs=[trl_grpo.make_reward_func()],
        args=trl_grpo.grpo_config(ns, work),
        train_dataset=trl_grpo.make_dataset(ns),
        peft_config=trl_grpo.lora_config(8),
    )
    trl.create_optimizer_and_scheduler(num_training_steps=args.updates + 1)
    trl.current_gradient_accumulation_steps = 1
    theirs = dict(trl.model.named_parameters())
    with torch.no_grad():
        for name, value in start.items():
            theirs[name].copy_(value)
    trl.model.train()
    inputs = trl_grpo._tensors(batch, trl.processing_class.pad_token_id)

    def trl_update(keep: dict | None = None) -> None:
        with trl.compute_loss_context_manager():
            loss = trl.compute_loss(trl.model, inputs)
        trl.accelerator.backward(loss)
        if keep is not None:
            keep.update({n: p.grad.detach().clone() for n, p in trl.model.named_parameters() if p.grad is not None})
        torch.nn.utils.clip_grad_norm_([p for p in trl.model.parameters() if p.requires_grad], 0.1)
        trl.optimizer.step()
        trl.lr_scheduler.step()
        trl.optimizer.zero_grad(set_to_none=True)

    theirs_grad: dict = {}
    trl_update(theirs_grad)
    cos, n_ours, n_theirs = compare(ours_grad, theirs_grad)
    result = {"trained_tokens": trained, "gradient": {"cosine": cos, "artweb_norm": n_ours, "trl_norm": n_theirs}}
    print(f"first gradient: cosine {cos:.9f}, norm artweb {n_ours:.6f}, TRL {n_theirs:.6f}", flush=True)

    moves = []
    for k in range(1, args.updates + 1):
        if k > 1:
            refresh_logprobs(ours, groups)
            ours.train_step(groups)
            trl_update()
        now = dict(ours.model.named_parameters())
        ours_move = {n: now[n].detach() - v for n, v in start.items()}
        theirs_move = {n: theirs[n].detach() - v for n, v in start.items()}
        cos, n_ours, n_theirs = compare(ours_move, theirs_move)
        moves.append({"update": k, "cosine": cos, "artweb_norm": n_ours, "trl_norm": n_theirs})
        print(f"after update {k}: weights moved {n_ours:.6f} (artweb) and {n_theirs:.6f} (TRL), cosine {cos:.9f}")
    result["moves"] = moves
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
