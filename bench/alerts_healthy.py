"""Record a healthy run of the shipped example for the alert rules' tests, and say which alerts it raised.

Runs the example task with the launch form's defaults (bench.run_curve.run_artweb) through a real worker,
prints the alerts the run raised (none is the expected answer: the run learns) and writes its steps'
stored metrics to tests/fixtures/example_run_steps.json, which tests/analytics/test_alerts.py
replays through every rule.

    python -m bench.alerts_healthy --steps 20
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from bench.run_curve import print_curve, run_artweb
from training.analytics.alerts import EVENT_KINDS
from training.models import Run, RunEvent, Step

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "example_run_steps.json"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    result = run_artweb(
        steps=args.steps, group_size=6, scenarios_per_step=4, max_tokens=48, learning_rate=2e-4, val_every=5
    )
    print_curve(result)
    run = Run.objects.get(id=result["run_id"])
    alerts = list(RunEvent.objects.filter(run=run, kind__in=EVENT_KINDS.values()).values_list("kind", "message"))
    print(f"\nCPU: {cpu_model()}\nalerts raised: {len(alerts)}")
    for kind, message in alerts:
        print(f"  {kind}: {message}")
    steps = [
        {
            "step": s.step,
            "reward_mean": s.reward_mean,
            "reward_std": s.reward_std,
            "val_reward": s.val_reward,
            "metrics": s.metrics,
        }
        for s in Step.objects.filter(run=run).order_by("step")
    ]
    FIXTURE.write_text(json.dumps({"config": run.config, "status": run.status, "steps": steps}, indent=1) + "\n")
    print(f"wrote {len(steps)} steps to {FIXTURE.relative_to(FIXTURE.parents[2])}")
    return 0 if run.status == Run.Status.COMPLETED else 1


if __name__ == "__main__":
    sys.exit(main())
