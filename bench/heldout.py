"""Held-out reward of the base model and of LoRA adapters, all measured the same way.

Each model answers every held-out scenario of the example task `--samples` times (sampling at
temperature 1, Hugging Face `generate`, one seed for all); the example reward scores the answers. One
evaluator for every trainer's adapter, so the comparison does not depend on whose sampler ran it.

    python -m bench.heldout --model-dir DIR --adapter artweb=CKPT_DIR --adapter trl=ADAPTER_DIR --out FILE
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.task import load_reward, load_scenarios, messages_for


def evaluate(model, tokenizer, scenarios: list[dict], samples: int, max_tokens: int, seed: int) -> dict:
    import torch

    score = load_reward()
    tokenizer.padding_side = "left"
    prompts = [
        tokenizer.apply_chat_template(messages_for(s), add_generation_prompt=True, tokenize=False) for s in scenarios
    ]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            **batch,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_tokens,
            num_return_sequences=samples,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        )
    answers = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    rewards = [score(scenarios[i // samples], a) for i, a in enumerate(answers)]
    per_scenario = [statistics.fmean(rewards[i : i + samples]) for i in range(0, len(rewards), samples)]
    return {"reward_mean": statistics.fmean(rewards), "answers": len(rewards), "per_scenario": per_scenario}


def main(argv: list[str] | None = None) -> int:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.engine.backends import resolve_dtype

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--adapter", action="append", default=[], help="NAME=DIR of a PEFT LoRA adapter; repeatable")
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)

    scenarios = [s for split, rows in load_scenarios().items() if split != "train" for s in rows]
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    results = {}
    for name, adapter in [("base", None), *(a.split("=", 1) for a in args.adapter)]:
        t = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=resolve_dtype("auto", "cpu"))
        if adapter:
            model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        model.eval()
        results[name] = evaluate(model, tokenizer, scenarios, args.samples, args.max_tokens, args.seed)
        results[name]["seconds"] = time.perf_counter() - t
        print(
            f"{name}: held-out reward {results[name]['reward_mean']:.3f} over {results[name]['answers']} answers "
            f"({results[name]['seconds']:.0f}s)",
            flush=True,
        )
        del model
        torch.manual_seed(0)
    args.out.write_text(json.dumps({"scenarios": len(scenarios), "samples": args.samples, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
