"""Client-driven runs: registering an ART client's model as a run, its training jobs, its checkpoints.

Each function takes the token's user; a model or job of anyone else is ClientError 404, the same answer
as one that does not exist. The run's status says what the client may do: a job is taken while the run
waits for it (or is queued, starting or running), and refused with the reason and what to do while it
is paused, cancelled, failed or completed on artweb.
"""

from __future__ import annotations

import hashlib

from django.db import transaction
from django.db.models import F, Max, Q
from django.db.models.functions import Greatest
from django.urls import reverse
from django.utils import timezone

from artweb.errors import ApplicationError
from artweb.visibility import own
from rollouts.models import Scenario, ScenarioSet
from rollouts.sandbox.batch import SandboxLimits
from rollouts.sandbox.records import megabytes
from training.client_runs.models import ClientModel, ClientTrainingJob, ClientTrainingJobEvent
from training.client_runs.wire import ParsedJob, WireError, parse_training_job
from training.config import run_config_parse
from training.jobs.services import job_enqueue
from training.models import Checkpoint, PretrainedModel, Run, Step
from training.selectors import quota_status, quota_steps_window_frees
from training.services import inference
from training.services.broadcast import run_figures_broadcast, run_row_message, runs_list_broadcast
from training.services.checkpoints import checkpoint_delete, checkpoint_protection_reason
from training.services.quotas import quota_check_run_start, quota_step_refusal, quota_window_frees
from training.services.runs import RUN_JOBS, config_with_recommended, run_event, run_transition


class ClientError(Exception):
    """An answer to the client: status and a message that says what to do ({"error": {...}} on the wire)."""

    def __init__(self, status: int, message: str, *, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


# How a run in each status answers a training job: None takes it.
_REFUSALS = {
    Run.Status.PAUSED: "is paused on artweb; resume it on its page ({url}), then train again",
    Run.Status.CANCELLED: "was cancelled on artweb; retry it on its page ({url}) to go on from its last "
    "checkpoint, or register a model under another name to start afresh",
    Run.Status.FAILED: "failed on artweb ({error}); retry it on its page ({url}) to go on from its last checkpoint",
    Run.Status.COMPLETED: "is completed on artweb; register a model under another name to train again",
}


def _run_url(run: Run) -> str:
    return reverse("run-detail", args=[run.id])


def run_refusal(run: Run) -> str | None:
    """Why the run takes no training job now (None: it does)."""
    why = _REFUSALS.get(run.status)
    if why is None:
        return None
    return f"The run '{run.name}' (#{run.id}) " + why.format(url=_run_url(run), error=run.error[:300] or "no reason")


def client_model_get(*, user, model_id) -> ClientModel:
    """The user's model by the id register() gave it; ClientError 404 otherwise. Notes the client's call."""
    found = None
    if str(model_id).isdigit():
        found = (
            own(ClientModel.objects.select_related("run", "run__base_model"), user).filter(run_id=int(model_id)).first()
        )
    if found is None:
        raise ClientError(
            404, f"No model with id {str(model_id)[:40]!r} is registered for you on artweb.", param="model_id"
        )
    ClientModel.objects.filter(id=found.id).update(contacted_at=timezone.now())
    return found


def _base_model_for(user, name: str) -> PretrainedModel:
    """A base model the user may train, by artweb name, source (a Hugging Face id) or local path."""
    usable = own(PretrainedModel.objects.all(), user)
    found = usable.filter(name=name).first() or usable.filter(source=name).order_by("id").first()
    if found is None:
        names = ", ".join(usable.order_by("name").values_list("name", flat=True)[:20]) or "none yet"
        raise ClientError(
            400,
            f"base_model {name!r} is not a base model you may train on artweb. Register it on the Models page "
            f"(or POST /api/v1/base-models/) and use its name or Hugging Face id; yours: {names}.",
            param="base_model",
        )
    return found


def _scenario_set_for(user, label: str) -> ScenarioSet:
    """The scenario set of a client's run: it fills with what the client's groups were about."""
    digest = hashlib.sha256(label.encode()).hexdigest()
    name = f"ART client: {label}"[:200]
    found, _ = ScenarioSet.objects.get_or_create(
        owner=user, name=name, defaults={"sha256": digest, "description": "Filled by the ART client's training jobs."}
    )
    return found


@transaction.atomic
def client_model_register(*, user, entity, project, name, base_model, return_existing) -> ClientModel:
    """`register()`: the user's run of that entity/project/name (a new one, queued for nothing yet)."""
    entity = entity or user.get_username()
    existing = own(ClientModel.objects.select_related("run"), user).filter(entity=entity, project=project, name=name)
    found = existing.select_for_update().first()
    if found is not None:
        if not return_existing:
            raise ClientError(409, f"A model {entity}/{project}/{name} is registered already.", param="name")
        if found.run.base_model.name != base_model and found.run.base_model.source != base_model:
            raise ClientError(
                409,
                f"The model {entity}/{project}/{name} trains {found.run.base_model.name}, not {base_model!r}; "
                "register another name to train another base model.",
                param="base_model",
            )
        ClientModel.objects.filter(id=found.id).update(contacted_at=timezone.now())
        return found
    pretrained = _base_model_for(user, base_model)
    try:
        quota_check_run_start(user=user)
    except ApplicationError as exc:
        raise ClientError(429, exc.message) from None
    label = f"{entity}/{project}/{name}"
    # Validation and sampling are the client's: none here. num_steps grows with each training job.
    config = run_config_parse({**config_with_recommended({}, pretrained), "val_every": 0, "num_steps": 1})
    run = Run.objects.create(
        owner=user,
        name=label[:200],
        tags=["art-client", project[:50]],
        base_model=pretrained,
        driver=Run.Driver.CLIENT,
        scenario_set=_scenario_set_for(user, label),
        config=config.model_dump(),
        num_steps=0,
        status=Run.Status.WAITING,
    )
    run_event(run=run, kind="created", message=f"Registered by an ART client as {label}.", actor=user)
    runs_list_broadcast(owner_id=user.id, message=run_row_message(run))
    return ClientModel.objects.create(
        owner=user,
        run=run,
        entity=entity,
        project=project,
        name=name,
        base_model_requested=base_model,
        contacted_at=timezone.now(),
    )


@transaction.atomic
def client_model_delete(*, user, model_id) -> None:
    """`backend.delete(model)`: the run stops (cancelled if it was active) and the name is free again. The
    run, its trajectories and its checkpoints stay on artweb, under its page, until someone deletes them."""
    found = client_model_get(user=user, model_id=model_id)
    run = Run.objects.select_for_update().get(id=found.run_id)
    run_transition(
        run=run,
        from_statuses=(*Run.ACTIVE_STATUSES, Run.Status.WAITING, Run.Status.PAUSED),
        to_status=Run.Status.CANCELLED,
        message="The ART client deleted its model; the run is kept here.",
        actor=user,
        cancel_requested=True,
    )
    found.delete()


def _scenarios(run: Run, parsed: ParsedJob) -> list[int]:
    """The scenario of each group in the run's set: found by its data, or added."""
    ids = []
    for group in parsed.groups:
        found = Scenario.objects.filter(scenario_set_id=run.scenario_set_id, data=group.scenario).first()
        if found is None:
            last = Scenario.objects.filter(scenario_set_id=run.scenario_set_id).aggregate(m=Max("index"))["m"]
            index = 0 if last is None else last + 1  # (not `last or -1`: the first scenario's index is 0)
            found = Scenario.objects.create(
                scenario_set_id=run.scenario_set_id, index=index, split=Scenario.Split.TRAIN, data=group.scenario
            )
            ScenarioSet.objects.filter(id=run.scenario_set_id).update(train_count=F("train_count") + 1)
        ids.append(found.id)
    return ids


def _quota_refusal(user, line) -> str:
    """A job refused for a quota: which one, and when to train again (the run is not paused: it waits)."""
    if line.key == "trajectory_bytes":
        why = (
            f"your runs' stored trajectories take {line.used_text}, the limit of your storage quota "
            f"({line.limit_text}, {line.source}). Delete runs you no longer need or ask an operator to raise "
            "your quota, then train again"
        )
    elif line.key == "gpu_seconds":
        frees = quota_window_frees(user=user, line=line)
        when = f" after {timezone.localtime(frees):%Y-%m-%d %H:%M %Z}" if frees else " later"
        why = (
            f"your runs' training steps took {line.used_text} of GPU time in the last 24 hours, the limit of your "
            f"quota ({line.limit_text} a day, {line.source}). Train again{when}, or ask an operator to raise it"
        )
    else:
        frees = quota_steps_window_frees(user=user)
        when = f" after {timezone.localtime(frees):%Y-%m-%d %H:%M %Z}" if frees else " later"
        why = (
            f"your runs trained {line.used_text} steps in the last 24 hours, the limit of your quota "
            f"({line.limit_text} steps a day, {line.source}). Train again{when}, or ask an operator to raise it"
        )
    return f"The training job was refused: {why}. Nothing of it was stored."


def client_job_create(*, user, body) -> ClientTrainingJob:
    """`POST /preview/training-jobs`: checked whole before anything is written, then queued as the run's
    next step (or behind the jobs already queued)."""
    model_id = body.get("model_id") if isinstance(body, dict) else None
    found = client_model_get(user=user, model_id=model_id)
    limits = SandboxLimits()
    try:
        parsed = parse_training_job(
            body, vocab_size=inference.vocab_size(found.run.base_model), record_bytes=limits.record_bytes
        )
    except WireError as exc:
        raise ClientError(400, str(exc), param=exc.param) from None
    if (line := quota_step_refusal(user=user)) is not None:
        raise ClientError(429, _quota_refusal(user, line))
    storage = next(line for line in quota_status(user=user) if line.key == "trajectory_bytes")
    if storage.limit is not None and storage.used + parsed.size_bytes > storage.limit:
        raise ClientError(
            429,
            f"The training job's trajectories take {megabytes(parsed.size_bytes)}, more than is left of your "
            f"storage quota ({storage.used_text} of {storage.limit_text} used, {storage.source}). Post fewer or "
            "smaller groups, delete runs you no longer need, or ask an operator to raise your quota. Nothing of "
            "it was stored.",
        )
    with transaction.atomic():
        run = Run.objects.select_for_update().get(id=found.run_id)
        if (why := run_refusal(run)) is not None:
            raise ClientError(409, why + ".")
        job = ClientTrainingJob.objects.create(
            run=run,
            groups=[
                {"scenario": sid, "trajectories": g.trajectories}
                for sid, g in zip(_scenarios(run, parsed), parsed.groups, strict=True)
            ],
            settings=parsed.settings,
            tokens=parsed.tokens,
        )
        pending = ClientTrainingJob.objects.filter(run=run, status__in=ClientTrainingJob.PENDING).count()
        Run.objects.filter(id=run.id).update(num_steps=Greatest(F("num_steps"), F("steps_done") + pending))
        run.refresh_from_db()
        run_event(
            run=run,
            kind="client_job",
            message=f"The ART client posted training job {job.id}: {len(parsed.groups)} groups.",
            data={"job": job.id, "groups": len(parsed.groups), **parsed.tokens},
        )
        if run_transition(
            run=run,
            from_statuses=(Run.Status.WAITING,),
            to_status=Run.Status.QUEUED,
            message=f"Training job {job.id} queued.",
        ):
            job_enqueue(jobs=RUN_JOBS, job=run)
    return job


def client_job_get(*, user, job_id) -> ClientTrainingJob:
    job = None
    if str(job_id).isdigit():
        job = (
            own(ClientTrainingJob.objects.select_related("run"), user, owner_field="run__owner")
            .filter(id=int(job_id))
            .first()
        )
    if job is None:
        raise ClientError(404, f"No training job {str(job_id)[:40]!r} of yours exists on artweb.")
    ClientModel.objects.filter(run_id=job.run_id).update(contacted_at=timezone.now())
    return job


def client_job_events(*, user, job_id, after=None, limit: int = 100) -> tuple[list[ClientTrainingJobEvent], bool]:
    """The job's events after the one with id `after` (ids increase), and whether more follow. A job whose
    run was paused, cancelled or failed on artweb before it trained fails here, saying so."""
    if not 1 <= limit <= 1000:
        raise ClientError(400, "'limit' must be from 1 to 1000.", param="limit")
    job = client_job_get(user=user, job_id=job_id)
    if job.status in ClientTrainingJob.PENDING:
        run = Run.objects.get(id=job.run_id)
        why = run_refusal(run)
        if why is not None and not run.worker:
            client_job_fail(job=job, message=why + "; nothing of this job was trained.")
    events = job.events.order_by("id")
    if after not in (None, ""):
        if not str(after).isdigit():
            raise ClientError(400, "'after' must be the id of an event this job listed.", param="after")
        events = events.filter(id__gt=int(after))
    page = list(events[: limit + 1])
    return page[:limit], len(page) > limit


def client_job_fail(*, job: ClientTrainingJob, message: str) -> None:
    """The job ends without a step: once (a conditional update), with the training_failed event."""
    with transaction.atomic():
        if (
            ClientTrainingJob.objects.filter(id=job.id, status__in=ClientTrainingJob.PENDING).update(
                status=ClientTrainingJob.Status.FAILED, error=message[:5000], finished_at=timezone.now()
            )
            == 1
        ):
            ClientTrainingJobEvent.objects.create(
                job_id=job.id, type=ClientTrainingJobEvent.Type.FAILED, data={"error_message": message[:5000]}
            )


def client_checkpoints(*, user, model_id, after=None, limit: int = 100, order: str = "asc") -> tuple[list, bool]:
    """The model's kept checkpoints, paged by id (`after`: the last id of the previous page)."""
    found = client_model_get(user=user, model_id=model_id)
    if order not in ("asc", "desc"):
        raise ClientError(400, "'order' must be 'asc' or 'desc'.", param="order")
    if not 1 <= limit <= 1000:
        raise ClientError(400, "'limit' must be from 1 to 1000.", param="limit")
    rows = Checkpoint.objects.filter(run_id=found.run_id, state=Checkpoint.State.ACTIVE)
    rows = rows.order_by("step" if order == "asc" else "-step")
    if after not in (None, ""):
        mark = Checkpoint.objects.filter(run_id=found.run_id, id=int(after) if str(after).isdigit() else -1).first()
        if mark is None:
            raise ClientError(400, "'after' must be the id of a checkpoint this model listed.", param="after")
        rows = rows.filter(Q(step__gt=mark.step) if order == "asc" else Q(step__lt=mark.step))
    page = list(rows[: limit + 1])
    return page[:limit], len(page) > limit


def client_checkpoints_delete(*, user, model_id, steps) -> tuple[int, list[int]]:
    """`delete_checkpoints()`: the files of those steps go (the rows stay, marked deleted). The newest
    checkpoint of a run that may still train is what it continues from: refused, by step."""
    found = client_model_get(user=user, model_id=model_id)
    if not isinstance(steps, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps):
        raise ClientError(400, "'steps' must be a list of step numbers.", param="steps")
    active = Checkpoint.objects.filter(run_id=found.run_id, state=Checkpoint.State.ACTIVE)
    by_step = {c.step: c for c in active.filter(step__in=set(steps)).select_related("run")}
    # All checked before any is deleted: a refused request deletes nothing.
    for step, ckpt in sorted(by_step.items()):
        if why := checkpoint_protection_reason(ckpt):
            raise ClientError(409, f"The checkpoint of step {step} cannot be deleted: {why}.", param="steps")
    for _, ckpt in sorted(by_step.items()):
        checkpoint_delete(checkpoint=ckpt, actor=user, reason="deleted by the ART client")
    return len(by_step), sorted(set(steps) - set(by_step))


def client_inference_target(*, user, name: str):
    """(run, checkpoint or None) that `wandb-artifact:///<entity>/<project>/<name>[:step<N>]` names for the
    user: the run's latest checkpoint (the base model before its first step), or step N's."""
    path = name.removeprefix("wandb-artifact:///")
    path, _, version = path.partition(":")
    parts = path.split("/")
    if len(parts) != 3:
        raise ClientError(
            404, f"{name!r} is not a model name artweb knows: wandb-artifact:///<entity>/<project>/<name>."
        )
    found = (
        own(ClientModel.objects.select_related("run"), user)
        .filter(entity=parts[0], project=parts[1], name=parts[2])
        .first()
    )
    if found is None:
        raise ClientError(
            404, f"No model {path!r} is registered for you on artweb; call register() first.", param="model"
        )
    ClientModel.objects.filter(id=found.id).update(contacted_at=timezone.now())
    run = found.run
    if run.status in (Run.Status.PAUSED, Run.Status.CANCELLED):
        raise ClientError(409, run_refusal(run) + ".", param="model")
    active = Checkpoint.objects.filter(run=run, state=Checkpoint.State.ACTIVE)
    if version:
        if not version.startswith("step") or not version[4:].isdigit():
            raise ClientError(400, f"{version!r} is not a checkpoint: use :step<N>.", param="model")
        ckpt = active.filter(step=int(version[4:])).first()
        if ckpt is None and int(version[4:]) != 0:
            raise ClientError(404, f"The model {path} has no kept checkpoint of step {version[4:]}.", param="model")
        return run, ckpt
    if not run.steps_done:
        return run, None
    ckpt = active.filter(step=run.steps_done).first() or active.order_by("-step").first()
    return run, ckpt


def client_val_reward_record(*, run: Run, reward: float) -> None:
    """A validation reward the client logged: its latest step's (and checkpoint's), and the run's best."""
    Run.objects.filter(Q(best_val_reward__isnull=True) | Q(best_val_reward__lt=reward), id=run.id).update(
        best_val_reward=reward
    )
    if run.steps_done:
        Step.objects.filter(run=run, step=run.steps_done).update(val_reward=reward)
        Checkpoint.objects.filter(run=run, step=run.steps_done).update(val_reward=reward)
    run_figures_broadcast(run_id=run.id)  # the run page's best validation reward, live
