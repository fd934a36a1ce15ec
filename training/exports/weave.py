"""Weave: rollout scripts decorate their own functions with @weave.op; artweb only hands the sandbox
what weave needs to trace them to the run's Weave project.

The step loop passes export_rollout_env(run=...) as RolloutRequest.env. The sandbox copies these
variables into the script's otherwise clean environment and, when WEAVE_PROJECT is set and weave is
importable, calls weave.init(WEAVE_PROJECT) before the script runs; otherwise `import weave` gives a
no-op stand-in, so a script with @weave.op runs the same with or without Weave.
"""

from __future__ import annotations

import logging
import os

from training.models import ExportTarget, Run

logger = logging.getLogger(__name__)

# The variables a rollout sandbox passes through to user code for Weave (nothing else of the worker's env).
ROLLOUT_ENV_KEYS = ("WEAVE_PROJECT", "WANDB_API_KEY", "WANDB_BASE_URL", "WF_TRACE_SERVER_URL", "WANDB_MODE",
                    "WANDB_DIR")


def export_rollout_env(*, run: Run) -> dict[str, str]:
    """Environment for the run's rollout sandboxes: {} unless the run has Weave configured with a key.

    Called on the GPU worker between steps, so it never raises: a broken Weave setting means rollouts
    run untraced (and the worker log says why), never a failed step.
    """
    from training.exports.selectors import export_targets_for_run
    from training.exports.services import export_target_secret

    try:
        target = next((t for t in export_targets_for_run(run=run) if t.kind == ExportTarget.Kind.WEAVE), None)
        if target is None:
            return {}
        key = export_target_secret(target)
        if not key:
            logger.warning("Weave is configured but no W&B API key is stored or in WANDB_API_KEY; "
                           "rollouts run untraced", extra={"run_id": run.id})
            return {}
        env = {"WEAVE_PROJECT": target.settings["project"], "WANDB_API_KEY": key}
        base_url = target.settings.get("base_url") or os.environ.get("WANDB_BASE_URL", "")
        if base_url:
            env["WANDB_BASE_URL"] = base_url
        if os.environ.get("WF_TRACE_SERVER_URL"):
            env["WF_TRACE_SERVER_URL"] = os.environ["WF_TRACE_SERVER_URL"]
        return env
    except Exception as exc:  # noqa: BLE001 - see the docstring: never fail a step over tracing
        logger.warning("Weave settings unusable (%s); rollouts run untraced", exc, extra={"run_id": run.id})
        return {}
