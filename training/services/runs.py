"""The run lifecycle. Every status change is a conditional UPDATE plus a RunEvent row, so a duplicate
Celery delivery or a double click changes nothing the second time."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from artweb.dispatch import publish_on_commit
from artweb.errors import ApplicationError
from rollouts.models import RewardFunctionVersion, RolloutScriptVersion, ScenarioSet
from rollouts.runtime.validation import script_sets_reward
from training import task_names
from training.config import run_config_parse
from training.exports.hooks import run_finished
from training.models import Checkpoint, PretrainedModel, Run, RunEvent
from training.services.broadcast import (
    event_message,
    run_broadcast,
    run_row_message,
    runs_list_broadcast,
    status_message,
)
from training.services.judges import judge_resolve
from training.services.quotas import quota_check_run_start

S = Run.Status


def run_event(*, run: Run, kind: str, message: str = "", data: dict | None = None, actor=None) -> RunEvent:
    event = RunEvent.objects.create(run=run, kind=kind, message=message, data=data or {}, actor=actor)
    run_broadcast(run.id, event_message(event))
    return event


@transaction.atomic
def run_transition(*, run: Run, from_statuses, to_status: str, message: str = "", actor=None, **fields) -> bool:
    """Move run to to_status if it is in one of from_statuses. Returns False (and writes nothing) if
    another actor got there first. The status and its event are committed together: nobody reads one
    without the other."""
    if isinstance(from_statuses, str):
        from_statuses = (from_statuses,)
    now = timezone.now()
    if to_status == S.RUNNING:
        fields.setdefault("started_at", run.started_at or now)
    if to_status in Run.FINAL_STATUSES:
        fields.setdefault("finished_at", now)
    updated = Run.objects.filter(id=run.id, status__in=from_statuses).update(status=to_status, **fields)
    if updated != 1:
        return False
    old = run.status
    run.refresh_from_db()
    run_event(
        run=run,
        kind="status",
        message=message or f"{old} → {to_status}",
        data={"from": old, "to": to_status},
        actor=actor,
    )
    if to_status in Run.FINAL_STATUSES:
        transaction.on_commit(lambda: run_finished(run_id=run.id))
    run_broadcast(
        run.id,
        status_message(
            run_id=run.id, status=to_status, steps_done=run.steps_done, num_steps=run.num_steps, error=run.error
        ),
        to_list=True,
    )
    return True


def _enqueue(run: Run) -> None:
    """Owe the run a step message and send it after commit; a broker that cannot take it leaves the run
    queued with the message owed, and the sweep sends it later (artweb.dispatch)."""
    Run.objects.filter(id=run.id).update(dispatched_at=None)
    publish_on_commit(task_names.RUN_STEP, args=(run.id,), sent=lambda: run_dispatched(run.id))


def run_dispatched(run_id: int) -> None:
    Run.objects.filter(id=run_id).update(dispatched_at=timezone.now())


def _owned(obj, owner, what: str, field: str):
    """what: the thing as a person calls it (in the message); field: the input that named it (the key)."""
    if getattr(obj, "owner_id", None) not in (None, owner.id) and not owner.is_staff:
        raise ApplicationError(f"That {what} is not yours.", field_errors={field: ["not found"]})


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
    _owned(script_version.asset, owner, "script", "script_version")
    _owned(scenario_set, owner, "scenario set", "scenario_set")
    _owned(base_model, owner, "base model", "base_model")
    if reward_version is not None:
        _owned(reward_version.asset, owner, "reward function", "reward_version")
    elif not cfg.use_ruler and not script_sets_reward(script_version.content):
        # Every rollout would fail for want of a reward: say so now, not after the first step.
        raise ApplicationError(
            "This run has no reward source: no reward function is attached, RULER is off, and the rollout "
            "script never sets a reward. Choose a reward function (for the example script, the example "
            'reward), tick "Use ruler", or set trajectory.reward in the script.',
            field_errors={"reward_version": ["required: the script sets no reward and RULER is off"]},
        )
    if cfg.ruler_judge:
        judge_resolve(owner=owner, value=cfg.ruler_judge)
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
        status=S.QUEUED,
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
    if run.status in Run.FINAL_STATUSES:
        raise ApplicationError(f"The run is already {run.status}; there is nothing to cancel.")
    if run_transition(
        run=run,
        from_statuses=(S.QUEUED, S.PAUSED),
        to_status=S.CANCELLED,
        message="Cancelled before it ran.",
        actor=actor,
    ):
        return run
    Run.objects.filter(id=run.id).update(cancel_requested=True)
    run_event(run=run, kind="cancel_requested", message="Cancel requested; stopping at the next check.", actor=actor)
    run.refresh_from_db()
    return run


@transaction.atomic
def run_pause(*, run: Run, actor=None) -> Run:
    if run.status not in Run.ACTIVE_STATUSES:
        raise ApplicationError(f"Only a queued or running run can be paused; this one is {run.status}.")
    if run_transition(run=run, from_statuses=(S.QUEUED,), to_status=S.PAUSED, message="Paused.", actor=actor):
        return run
    Run.objects.filter(id=run.id).update(pause_requested=True)
    run_event(run=run, kind="pause_requested", message="Pause requested; pausing after the current step.", actor=actor)
    run.refresh_from_db()
    return run


@transaction.atomic
def run_resume(*, run: Run, actor=None) -> Run:
    if run.status != S.PAUSED:
        raise ApplicationError(f"Only a paused run can be resumed; this one is {run.status}.")
    quota_check_run_start(user=run.owner, actor=actor)
    if run_transition(
        run=run, from_statuses=(S.PAUSED,), to_status=S.QUEUED, message="Resumed.", actor=actor, pause_requested=False
    ):
        _enqueue(run)
    return run


@transaction.atomic
def run_retry(*, run: Run, actor=None) -> Run:
    """Requeue a failed (or cancelled) run; it continues from its last checkpoint."""
    if run.status not in (S.FAILED, S.CANCELLED):
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
        from_statuses=(S.FAILED, S.CANCELLED),
        to_status=S.QUEUED,
        message=message,
        actor=actor,
        error="",
        cancel_requested=False,
        pause_requested=False,
        finished_at=None,
    ):
        _enqueue(run)
    return run
