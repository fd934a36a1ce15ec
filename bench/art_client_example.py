"""The shipped example task written as an ART user's own training script, run by ART's client from PyPI
against artweb (bench.client_run starts it in an environment holding openpipe-art and nothing of artweb).

It is the uploaded example (rollouts/examples/rollout.py, reward.py, scenarios.jsonl) moved to the client:
the same prompts, the same reward function file, the same group size, scenarios per step and learning
rate; the rollouts and the held-out evaluation run here, the updates on artweb's worker. The only line an
ART user changes is the backend's. Prints one JSON line per step.

    python bench/art_client_example.py <examples dir> --steps 20 --seed 0
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import art

SYSTEM = "You are a concise writer. Answer with a single sentence."


def load(examples: Path):
    spec = importlib.util.spec_from_file_location("example_reward", examples / "reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = [json.loads(line) for line in (examples / "scenarios.jsonl").read_text().splitlines() if line.strip()]
    train = [SimpleNamespace(**r) for r in rows if r.get("split", "train") == "train"]
    held_out = [SimpleNamespace(**r) for r in rows if r.get("split") == "validation"]
    return module.reward, train, held_out


async def rollout(model: art.TrainableModel, scenario, reward_fn, max_tokens: int, step: int | None = None):
    client = model.openai_client()
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": scenario.prompt}]
    completion = await client.chat.completions.create(
        model=model.get_inference_name(step=step),
        messages=messages,
        max_tokens=max_tokens,
        temperature=1.0,
        logprobs=True,
    )
    trajectory = art.Trajectory(
        messages_and_choices=[*messages, completion.choices[0]], metadata={"word": scenario.word}
    )
    trajectory.reward = reward_fn(trajectory, scenario)
    return trajectory


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("examples", type=Path)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--group-size", type=int, default=6)
    parser.add_argument("--scenarios-per-step", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--val-every", type=int, default=5)
    parser.add_argument("--val-scenarios", type=int, default=8)
    parser.add_argument("--base-model", required=True)
    parser.add_argument("--name", required=True)
    args = parser.parse_args()
    reward_fn, train, held_out = load(args.examples)

    model = art.TrainableModel(name=args.name, project="bench-client", base_model=args.base_model)
    backend = art.ServerlessBackend(api_key=os.environ["ARTWEB_TOKEN"], base_url=os.environ["ARTWEB_ART_URL"])
    await model.register(backend)

    # The scenarios the uploaded run samples for the same seed (training.services.steps.batch.scenarios_sample).
    held = random.Random(f"{args.seed}:validation:0").sample(held_out, min(args.val_scenarios, len(held_out)))
    for step in range(await model.get_step() + 1, args.steps + 1):
        rng = random.Random(f"{args.seed}:train:{step}")
        scenarios = rng.sample(train, args.scenarios_per_step)
        t0 = time.perf_counter()
        groups = await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup(rollout(model, s, reward_fn, args.max_tokens) for _ in range(args.group_size))
                for s in scenarios
            ),
            pbar_desc=None,
        )
        t1 = time.perf_counter()
        result = await backend.train(model, groups, learning_rate=args.learning_rate)
        t2 = time.perf_counter()
        rewards = [t.reward for g in groups for t in g.trajectories]
        line = {
            "step": result.step,
            "reward_mean": statistics.fmean(rewards),
            "rollouts_s": t1 - t0,
            "train_call_s": t2 - t1,
        }
        if args.val_every and (step % args.val_every == 0 or step == args.steps) and held:
            trajs = await asyncio.gather(*(rollout(model, s, reward_fn, args.max_tokens) for s in held))
            line["val_reward"] = statistics.fmean(t.reward for t in trajs)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
