"""Does the default model learn a tool-calling task? Train the shipped tool agent
(rollouts/examples/tool_rollout.py with tool_scenarios.jsonl) through the real stack and print, per step, the
share of rollouts that called the tool and the mean reward.

The agent's first turn is a forced call (tool_choice names the tool, and the server constrains its
arguments to the tool's JSON schema); the second answers in words. Its reward: 0.2 for a call, 0.8 for
naming the capital the tool returned. Settings are the launch form's defaults but for the step count and
max_tokens (two turns of a short answer). Uses the database and Redis the settings point at.

    python -m bench.tool_learn --steps 20 --out bench/results/tool_learn.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from bench.defaults_learn import _cpu
from bench.run_curve import EXAMPLES, run_artweb
from training.models import Trajectory


def tool_call_shares(run_id: int) -> dict[int, tuple[float, int]]:
    """Per step: the share of its training rollouts with at least one tool call, and how many there were."""
    out: dict[int, list[int]] = {}
    for step, metrics in Trajectory.objects.filter(group__run_id=run_id, group__split="train").values_list(
        "step", "metrics"
    ):
        called = int((metrics or {}).get("tool_calls", 0) > 0)
        out.setdefault(step, []).append(called)
    return {step: (sum(v) / len(v), len(v)) for step, v in sorted(out.items())}


def report(result: dict, shares: dict[int, tuple[float, int]], *, cpu: str) -> str:
    lines = [
        "# The default model on the tool example",
        "",
        f"CPU: {cpu}. Run {result['run_id']} {result['status']} after {result['wall_seconds']:.0f} s wall.",
        f"Config: `{result['config']}`.",
        "",
        "| step | rollouts | with a tool call | mean reward | held-out reward |",
        "|---:|---:|---:|---:|---:|",
    ]
    for s in result["steps"]:
        share, n = shares.get(s["step"], (float("nan"), 0))
        val = "" if s["val_reward"] is None else f"{s['val_reward']:.3f}"
        lines.append(f"| {s['step']} | {n} | {share:.0%} | {s['reward_mean']:.3f} | {val} |")
    rewards = [s["reward_mean"] for s in result["steps"] if s["reward_mean"] is not None]
    if len(rewards) >= 6:
        first, last = statistics.fmean(rewards[:3]), statistics.fmean(rewards[-3:])
        lines += ["", f"Mean reward, first 3 steps {first:.3f}; last 3 steps {last:.3f} ({last - first:+.3f})."]
    if shares:
        first_step = shares[min(shares)][0]
        lines.append(
            f"Rollouts with a tool call: {first_step:.0%} at step 1, "
            f"{min(s for s, _ in shares.values()):.0%} at the lowest step."
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--val-every", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=5400)
    parser.add_argument("--out", type=Path, help="also write the report (markdown) here")
    args = parser.parse_args(argv)
    cpu = _cpu()
    print(f"CPU: {cpu}", flush=True)
    started = time.time()
    result = run_artweb(
        steps=args.steps,
        group_size=6,
        scenarios_per_step=4,
        max_tokens=args.max_tokens,
        learning_rate=2e-4,
        val_every=args.val_every,
        timeout=args.timeout,
        script=EXAMPLES / "tool_rollout.py",
        reward=None,
        scenarios=EXAMPLES / "tool_scenarios.jsonl",
    )
    text = report(result, tool_call_shares(result["run_id"]), cpu=cpu)
    print(text)
    print(f"wall: {time.time() - started:.0f} s")
    if args.out:
        args.out.write_text(text)
    return 0 if result["status"] == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
