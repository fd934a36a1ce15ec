"""Print a run's steps and the wall time of each phase of a step, in the layout of bench/run_curve.py.

For a run started anywhere (from the browser under `make run`, through the API), so that a step in real
use can be set beside the benchmark's (`make bench`, bench/run_curve.py): both GPU workers are started
with the same settings (artweb.launcher.worker). Reads the database DATABASE_URL names, or, when it is
unset, the embedded PostgreSQL that `make run` is running.

    python -m bench.step_phases 12                  # every step of run 12
    python -m bench.step_phases 12 --skip-first 1   # without step 1 (it pays the first adapter load)
"""

from __future__ import annotations

import argparse
import os
import sys


def embedded_database_url() -> str | None:
    """The URL of the embedded PostgreSQL a running `make run` started, or None when none runs."""
    from artweb.launcher import data_dir_from_env
    from artweb.launcher.embedded import EmbeddedPostgres, ServiceState, service_password

    postgres = EmbeddedPostgres(data_dir_from_env() / "services")
    state = ServiceState.read(postgres.state_file)
    if state is None or not postgres.is_server(state.pid):
        return None
    postgres.state, postgres.password = state, service_password(postgres.root.parent, postgres.name)
    return postgres.url


def run_phases(run, *, skip_first: int = 0) -> dict:
    """The run's steps (after the first skip_first) as bench.run_curve.print_curve reads them."""
    from django.utils import timezone

    from training.models import Step

    steps = [
        {
            "step": s.step,
            "reward_mean": s.reward_mean,
            "val_reward": s.val_reward,
            "seconds": s.timings.get("step", s.duration_s),
            "timings": s.timings,
        }
        for s in Step.objects.filter(run=run, step__gt=skip_first).order_by("step")
    ]
    wall = ((run.finished_at or timezone.now()) - run.started_at).total_seconds() if run.started_at else 0.0
    return {"run_id": run.id, "status": run.status, "config": run.config, "steps": steps, "wall_seconds": wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_id", type=int)
    parser.add_argument("--skip-first", type=int, default=0, metavar="N", help="leave out the first N steps")
    args = parser.parse_args(argv)
    if not os.environ.get("DATABASE_URL") and (url := embedded_database_url()):
        os.environ["DATABASE_URL"] = url  # read by the settings, which the next import loads
    from bench.run_curve import print_curve  # sets Django up
    from training.models import Run

    run = Run.objects.filter(id=args.run_id).first()
    if run is None:
        print(f"There is no run {args.run_id} in this database; check DATABASE_URL and the run's id.", file=sys.stderr)
        return 2
    result = run_phases(run, skip_first=args.skip_first)
    if not result["steps"]:
        print(f"Run {run.id} ({run.status}) has no completed step after step {args.skip_first} yet.", file=sys.stderr)
        return 1
    print_curve(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
