"""The names of training's Celery tasks: services queue work by name (artweb.dispatch), so they never
import the tasks module, which imports them. Routes (artweb/celery.py) use the same names."""

RUN_STEP = "training.tasks.run_step_task"
RESCORE_EXECUTE = "training.tasks.rescore_execute_task"
RUNS_REQUEUE_STALE = "training.tasks.runs_requeue_stale_task"
# Registered under its old module's name: a message queued before dry runs moved to training still runs.
DRY_RUN = "rollouts.tasks.dry_run_task"
RUN_EXPORTS = "training.exports.tasks.run_exports_task"
EXPORT_SYNC = "training.exports.tasks.export_sync_task"
SERVE_JOB_EXECUTE = "training.tasks.serve_job_execute_task"

# The queue each task's messages go to (artweb.celery routes them by these names): work that needs the
# inference server or the trainer goes to the GPU workers. Any other task's go to "default".
QUEUES = {RUN_STEP: "gpu", DRY_RUN: "gpu"}


def queue(task_name: str) -> str:
    return QUEUES.get(task_name, "default")
