"""The run lifecycle. Every status change is a conditional UPDATE plus a RunEvent row, so a duplicate
Celery delivery or a double click changes nothing the second time: a run is a background job of the
kind RUN_JOBS (training.jobs), whose changes its page and the runs list hear of."""

from __future__ import annotations

from django.db import transaction

from artweb.dispatch import waiting_messages
from artweb.errors import ApplicationError
from artweb.visibility import may_change, require_visible
from rollouts.models import RewardFunctionVersion, RolloutScriptVersion, ScenarioSet
from rollouts.sandbox.validation import script_sets_reward
from rollouts.selectors import attachments_resolve, script_version_sources
from training import task_names
from training.config import run_config_parse
from training.exports.hooks import run_finished
from training.jobs.kinds import REQUEUE, JobKind
from training.jobs.services import job_dispatched, job_enqueue, job_event, job_transition
from training.models import Checkpoint, PretrainedModel, Run, RunEvent
from training.services.broadcast import (
    event_message,
    queue_broadcast,
    run_broadcast,
    run_row_message,
    runs_list_broadcast,
    status_message,
)
from training.services.judges import judge_resolve
from training.services.quotas import quota_check_run_start
from training.services.tools import run_tools_check

# The statuses in which each action on a run is allowed: the rule the services below enforce, that the
# run page's buttons show (run_actions, and run_status_message on the socket) and the API reports.
# In button order.
ACTION_STATUSES = {
    "cancel": (Run.Status.QUEUED, Run.Status.STARTING, Run.Status.RUNNING, Run.Status.WAITING, Run.Status.PAUSED),
    "pause": (*Run.ACTIVE_STATUSES, Run.Status.WAITING),
    "resume": (Run.Status.PAUSED,),
    "retry": (Run.Status.FAILED, Run.Status.CANCELLED),
}


def run_status_actions(status: str) -> list[str]:
    """The actions a run in this status allows, for anyone who may change the run."""
    return [action for action, statuses in ACTION_STATUSES.items() if status in statuses]


def run_actions(*, run: Run, user) -> list[str]:
    """The actions this user may take on the run now: none on a run they may not change."""
    return run_status_actions(run.status) if may_change(user, run) else []


def run_status_message(run: Run) -> dict:
    """The run's status message (live and on a page's catch-up), with the actions its status allows."""
    return status_message(
        run_id=run.id,
        status=run.status,
        steps_done=run.steps_done,
        num_steps=run.num_steps,
        error=run.error,
        actions=run_status_actions(run.status),
    )


def _run_event_sent(run: Run, event: RunEvent) -> None:
    run_broadcast(run.id, event_message(event))


def _run_status_changed(run: Run, old: str) -> None:
    if run.status in Run.FINAL_STATUSES:
        transaction.on_commit(lambda: run_finished(run_id=run.id))
    run_broadcast(run.id, run_status_message(run), to_list=True)
    if not run.worker and (old in Run.ACTIVE_STATUSES or run.status in Run.ACTIVE_STATUSES):
        queue_broadcast(left=(run.id,))  # a run queued, paused or stopped between steps moves the others' places


def _run_requeue_note(run: Run) -> tuple[str, dict]:
    if run.worker:
        message = f"Worker {run.worker} stopped heartbeating; requeued from step {run.steps_done}."
    else:
        message = f"No worker took step {run.steps_done + 1}; queued it again."
    return message, {"worker": run.worker, "steps_done": run.steps_done}


def _runs_stale_scope(rows):
    """The runs the sweep may requeue: those whose worker stopped heartbeating, and the runs between steps (no
    worker) only while fewer step messages wait on the broker than runs wait for a turn. A step message is a
    turn that goes to the run first in the fair queue (training.services.steps.fair), so a run waiting behind
    others keeps its turn without a message of its own; only a lost message (a broker that restarted empty)
    leaves waiting runs without enough turns. Where the broker cannot say, every stale run is requeued."""
    queued = waiting_messages(task_names.queue(task_names.RUN_STEP))
    if queued is None:
        return rows
    waiting = Run.objects.filter(status__in=Run.ACTIVE_STATUSES, worker="").count()
    return rows.exclude(worker="") if queued >= waiting else rows


# A worker takes a run's lease for each step (training.services.steps.leases), and the step moves the
# run's status; a run whose worker died is requeued at the step it owes, from its last checkpoint.
RUN_JOBS = JobKind(
    name="runs",
    model=Run,
    task=task_names.RUN_STEP,
    claimable=Run.ACTIVE_STATUSES,
    claimed_status=None,
    working=(Run.Status.STARTING, Run.Status.RUNNING),
    recovery=REQUEUE,
    finished_status=Run.Status.COMPLETED,
    requeue_kwargs=lambda run: {"step": run.steps_done + 1},
    requeue_note=_run_requeue_note,
    on_event=_run_event_sent,
    on_status=_run_status_changed,
    stale_scope=_runs_stale_scope,
)


def run_event(*, run: Run, kind: str, message: str = "", data: dict | None = None, actor=None) -> RunEvent:
    return job_event(jobs=RUN_JOBS, job=run, kind=kind, message=message, data=data, actor=actor)


def run_transition(*, run: Run, from_statuses, to_status: str, message: str = "", actor=None, **fields) -> bool:
    """Move run to to_status if it is in one of from_statuses. Returns False (and writes nothing) if
    another actor got there first. The status and its event are committed together: nobody reads one
    without the other (training.jobs.services.job_transition)."""
    return job_transition(
        jobs=RUN_JOBS, job=run, from_statuses=from_statuses, to_status=to_status, message=message, actor=actor, **fields
    )


def _enqueue(run: Run) -> None:
    """Owe the run a step message and send it after commit; a broker that cannot take it leaves the run
    queued with the message owed, and the sweep sends it later (artweb.dispatch)."""
    job_enqueue(jobs=RUN_JOBS, job=run)


def run_dispatched(run_id: int) -> None:
    job_dispatched(jobs=RUN_JOBS, job_id=run_id)


def config_with_recommended(config: dict | None, base_model: PretrainedModel) -> dict:
    """The run config with the base model's recommended training settings under the ones given: a train
    key the caller leaves out takes the model's recommendation, then artweb's default."""
    config = dict(config or {})
    train = config.get("train")
    if base_model.recommended_train and (train is None or isinstance(train, dict)):
        config["train"] = {**base_model.recommended_train, **(train or {})}
    return config


def _run_name(name: str) -> str:
    name = (name or "").strip()
    if not name or len(name) > 200:
        raise ApplicationError("Give the run a name of 1 to 200 characters.", field_errors={"name": ["required"]})
    return name


def _run_tags(tags: list[str] | None) -> list[str]:
    """At most 20 tags of at most 50 characters; blank ones dropped."""
    return [t.strip()[:50] for t in (tags or []) if t and t.strip()][:20]


@transaction.atomic
def run_create(
    *,
    owner,
    name: str,
    base_model: PretrainedModel,
    script_version: RolloutScriptVersion,
    scenario_set: ScenarioSet,
    reward_version: RewardFunctionVersion | None = None,
    config: dict | None = None,
    tags: list[str] | None = None,
    start: bool = True,
) -> Run:
    name = _run_name(name)
    cfg = run_config_parse(config_with_recommended(config, base_model))
    # A run may use what its owner may see.
    require_visible(owner, script_version.asset, what="script", field="script_version")
    require_visible(owner, scenario_set, what="scenario set", field="scenario_set")
    require_visible(owner, base_model, what="base model", field="base_model")
    if reward_version is not None:
        require_visible(owner, reward_version.asset, what="reward function", field="reward_version")
    elif not cfg.use_ruler and not any(script_sets_reward(s) for s in script_version_sources(script_version)):
        # Every rollout would fail for want of a reward: say so now, not after the first step. A bundle's
        # other modules count (ART's examples set the reward in theirs, called from rollout.py).
        raise ApplicationError(
            "This run has no reward source: no reward function is attached, RULER is off, and the rollout "
            "script never sets a reward. Choose a reward function (for the example script, the example "
            'reward), tick "Use ruler", or set trajectory.reward in the script.',
            field_errors={"reward_version": ["required: the script sets no reward and RULER is off"]},
        )
    if cfg.ruler_judge:
        judge_resolve(owner=owner, value=cfg.ruler_judge)
    run_tools_check(owner=owner, cfg=cfg)  # named hosts allowed to the owner, secrets theirs
    attachments_resolve(owner=owner, names=cfg.attachments)  # each one the owner's own
    if scenario_set.train_count == 0:
        raise ApplicationError("The scenario set has no training scenarios.", field_errors={"scenario_set": ["empty"]})
    quota_check_run_start(user=owner)  # the run is queued at once, started or not
    tags = _run_tags(tags)
    run = Run.objects.create(
        owner=owner,
        name=name,
        tags=tags,
        base_model=base_model,
        script_version=script_version,
        reward_version=reward_version,
        scenario_set=scenario_set,
        config=cfg.model_dump(),
        num_steps=cfg.num_steps,
        status=Run.Status.QUEUED,
    )
    run_event(run=run, kind="created", message="Run created and queued.", actor=owner)
    runs_list_broadcast(owner_id=owner.id, message=run_row_message(run))  # the runs list shows it live
    if start:
        _enqueue(run)
    return run


@transaction.atomic
def run_details_update(*, run: Run, name: str, tags: list[str] | None, actor=None) -> Run:
    """Rename or retag a run (the admin's edit form): the run's event says who changed what."""
    name, tags = _run_name(name), _run_tags(tags)
    old = Run.objects.values("name", "tags").get(id=run.id)
    changed = {
        key: {"from": old[key], "to": value} for key, value in (("name", name), ("tags", tags)) if old[key] != value
    }
    if not changed:
        return run
    Run.objects.filter(id=run.id).update(name=name, tags=tags)
    run.refresh_from_db()
    run_event(run=run, kind="edited", message="Edited: " + ", ".join(sorted(changed)) + ".", data=changed, actor=actor)
    runs_list_broadcast(owner_id=run.owner_id, message=run_row_message(run))
    return run


@transaction.atomic
def run_cancel(*, run: Run, actor=None) -> Run:
    """Cancel now if nothing is executing; otherwise flag it and the worker stops at its next check."""
    if run.status not in ACTION_STATUSES["cancel"]:
        raise ApplicationError(f"The run is already {run.status}; there is nothing to cancel.")
    if run_transition(
        run=run,
        from_statuses=(Run.Status.QUEUED, Run.Status.WAITING, Run.Status.PAUSED),
        to_status=Run.Status.CANCELLED,
        message="Cancelled before it ran." if run.status != Run.Status.WAITING else "Cancelled between steps.",
        actor=actor,
    ):
        return run
    Run.objects.filter(id=run.id).update(cancel_requested=True)
    run_event(run=run, kind="cancel_requested", message="Cancel requested; stopping at the next check.", actor=actor)
    run.refresh_from_db()
    return run


@transaction.atomic
def run_pause(*, run: Run, actor=None) -> Run:
    if run.status not in ACTION_STATUSES["pause"]:
        raise ApplicationError(f"Only a queued or running run can be paused; this one is {run.status}.")
    if run_transition(
        run=run,
        from_statuses=(Run.Status.QUEUED, Run.Status.WAITING),
        to_status=Run.Status.PAUSED,
        message="Paused.",
        actor=actor,
    ):
        return run
    Run.objects.filter(id=run.id).update(pause_requested=True)
    run_event(run=run, kind="pause_requested", message="Pause requested; pausing after the current step.", actor=actor)
    run.refresh_from_db()
    return run


@transaction.atomic
def run_resume(*, run: Run, actor=None) -> Run:
    if run.status not in ACTION_STATUSES["resume"]:
        raise ApplicationError(f"Only a paused run can be resumed; this one is {run.status}.")
    quota_check_run_start(user=run.owner, actor=actor)
    if run_transition(
        run=run,
        from_statuses=(Run.Status.PAUSED,),
        to_status=Run.Status.QUEUED,
        message="Resumed.",
        actor=actor,
        pause_requested=False,
    ):
        _enqueue(run)
    return run


@transaction.atomic
def run_retry(*, run: Run, actor=None) -> Run:
    """Requeue a failed (or cancelled) run; it continues from its last checkpoint."""
    if run.status not in ACTION_STATUSES["retry"]:
        raise ApplicationError(f"Only a failed or cancelled run can be retried; this one is {run.status}.")
    if run.steps_done:
        if not Checkpoint.objects.filter(run=run, step=run.steps_done, state=Checkpoint.State.ACTIVE).exists():
            raise ApplicationError(
                f"This run cannot continue where it stopped: the checkpoint of step {run.steps_done}, its last "
                'completed step, was deleted. Use "Launch similar" to train a new run with the same settings '
                "from the base model."
            )
        message = f"Retrying: continuing from the checkpoint of step {run.steps_done}."
    else:
        message = "Retrying from the base model (no step was completed)."
    quota_check_run_start(user=run.owner, actor=actor)
    if run_transition(
        run=run,
        from_statuses=(Run.Status.FAILED, Run.Status.CANCELLED),
        to_status=Run.Status.QUEUED,
        message=message,
        actor=actor,
        error="",
        cancel_requested=False,
        pause_requested=False,
        finished_at=None,
    ):
        _enqueue(run)
    return run
