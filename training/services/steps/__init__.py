"""One GRPO step of a run, as one idempotent unit of work for a GPU worker, one job per module:

- leases: the run's lease (worker name + heartbeat) and the Heartbeat thread;
- fair: which waiting run a step message's turn goes to (the fair queue, training.selectors_queue);
- batch: the step's scenarios, its RULER judge and its rollouts in the sandbox;
- ahead: the next step's rollouts, run during this step's update (RunConfig.overlap_rollouts);
- groups: the scored groups written (and sent to the run page), their figures, the advantages;
- commit: the step's record, exactly once, then its message and exports;
- recovery: a step that lost its database or inference server, queued again;
- sweep: active runs nobody works on, queued again;
- execute: run_step_execute, the step from claim to the next step's message.
"""

from training.services.steps.batch import UNJAILED_EVENT, failures_allowed, sandbox_unjailed_warn
from training.services.steps.errors import StepAborted, StepFailed
from training.services.steps.execute import adapter_name, run_step_execute
from training.services.steps.leases import Heartbeat, run_claim, run_release, stale_after, worker_name
from training.services.steps.recovery import INFERENCE_RESTARTED_EVENT, INFERENCE_RETRIES
from training.services.steps.sweep import runs_requeue_stale

__all__ = [
    "INFERENCE_RESTARTED_EVENT",
    "INFERENCE_RETRIES",
    "UNJAILED_EVENT",
    "Heartbeat",
    "StepAborted",
    "StepFailed",
    "adapter_name",
    "failures_allowed",
    "run_claim",
    "run_release",
    "run_step_execute",
    "runs_requeue_stale",
    "sandbox_unjailed_warn",
    "stale_after",
    "worker_name",
]
