"""Reads of the serving app: which model a name means for a user (and every name they may use), and the
playground sessions and answer diffs they may see.

Model names are looked up among the user's own (artweb.visibility.own), staff's too: run names are not
unique across people, and `<run>@<step>` or an alias means the caller's. Sessions and diffs follow the
one rule (artweb.visibility.visible): their owner's, and staff see everyone's."""

from __future__ import annotations

from django.db.models import F
from django.db.models.functions import Abs
from django.shortcuts import get_object_or_404

from artweb.visibility import own, visible
from training.models import Checkpoint, PretrainedModel, Run
from training.services.steps import adapter_name
from training.serving.models import CheckpointAlias, DiffScenario, ServeJob
from training.serving.protocol import ServeError, ServeTarget

# --- which model a name means ----------------------------------------------------------------------


def _not_found(name: str) -> ServeError:
    return ServeError(
        404,
        f"The model '{name}' does not exist or you do not have access to it. GET /api/v1/openai/models lists "
        "the names you may use: base models, <run>@<step>, <run>@best, <run>@latest and your aliases.",
        code="model_not_found",
        param="model",
    )


def _servable_base_models(user):
    return own(PretrainedModel.objects.all(), user)


def _aliases(user):
    """The user's aliases of checkpoints whose files are kept."""
    return own(CheckpointAlias.objects.filter(checkpoint__state=Checkpoint.State.ACTIVE), user)


def _run_for(user, ref: str) -> Run | None:
    """A run of the user's by id (`7`, `run-7`) or by name (the newest of that name)."""
    runs = own(Run.objects.select_related("base_model"), user)
    digits = ref.removeprefix("run-")
    if digits.isdigit():
        found = runs.filter(id=int(digits)).first()
        if found is not None:
            return found
    return runs.filter(name=ref).order_by("-created_at", "-id").first()


def checkpoint_target(requested: str, ckpt: Checkpoint) -> ServeTarget:
    return ServeTarget(
        requested=requested,
        base_model_id=ckpt.run.base_model_id,
        adapter_name=adapter_name(ckpt.run, ckpt.step),
        adapter_path=ckpt.path,
        checkpoint_id=ckpt.id,
    )


def _run_checkpoint(run: Run, which: str) -> Checkpoint | None:
    """The kept checkpoint `<run>@which` names: latest, best (by validation reward, else the promoted one,
    else the latest) or a step number."""
    active = Checkpoint.objects.filter(run=run, state=Checkpoint.State.ACTIVE).select_related("run")
    if which == "latest":
        return active.order_by("-step").first()
    if which == "best":
        best = active.filter(val_reward__isnull=False).order_by("-val_reward", "-step").first()
        return best or active.filter(promoted=True).first() or active.order_by("-step").first()
    if which.isdigit():
        return active.filter(step=int(which)).first()
    raise ServeError(
        400, f"'{which}' is not a step: use <run>@<step number>, <run>@best or <run>@latest.", param="model"
    )


def serve_model_resolve(*, user, name: str) -> ServeTarget:
    """What `model=name` means for this user; ServeError 404 for anything not theirs (or not there)."""
    if not isinstance(name, str) or not name.strip():
        raise ServeError(400, "Name a model: the field 'model' is required.", param="model")
    name = name.strip()
    base = _servable_base_models(user).filter(name=name).first()
    if base is not None:
        return ServeTarget(requested=name, base_model_id=base.id)
    alias = _aliases(user).filter(name=name).select_related("checkpoint__run").first()
    if alias is not None:
        return checkpoint_target(name, alias.checkpoint)
    run_ref, sep, which = name.rpartition("@")
    run = _run_for(user, run_ref) if sep and run_ref else None
    if run is None:
        raise _not_found(name)
    ckpt = _run_checkpoint(run, which)
    if ckpt is None:
        raise _not_found(name)
    return checkpoint_target(name, ckpt)


def serve_model_list(*, user) -> list[dict]:
    """Every name the user may send as `model`, in OpenAI's model-list entries."""
    out = []
    for base in _servable_base_models(user).order_by("name"):
        out.append(_model_entry(base.name, base.created_at, "artweb" if base.owner_id is None else user.username))
    for alias in _aliases(user).order_by("name"):
        out.append(_model_entry(alias.name, alias.created_at, user.username))
    ckpts = (
        own(Checkpoint.objects.filter(state=Checkpoint.State.ACTIVE), user, owner_field="run__owner")
        .select_related("run")
        .order_by("run_id", "step")
    )
    seen_runs = set()
    for ckpt in ckpts:
        if ckpt.run_id not in seen_runs:
            seen_runs.add(ckpt.run_id)
            for which in ("latest", "best"):
                out.append(_model_entry(f"run-{ckpt.run_id}@{which}", ckpt.run.created_at, user.username))
        out.append(_model_entry(f"run-{ckpt.run_id}@{ckpt.step}", ckpt.created_at, user.username))
    return out


def _model_entry(name: str, created, owner: str) -> dict:
    return {"id": name, "object": "model", "created": int(created.timestamp()), "owned_by": owner}


# --- playground sessions and answer diffs -----------------------------------------------------------


def serve_job_get(*, user, job_id: int, kind: str) -> ServeJob:
    return get_object_or_404(serve_job_list(user=user, kind=kind), id=job_id)


def serve_job_list(*, user, kind: str):
    return visible(ServeJob.objects.filter(kind=kind), user).order_by("-created_at")


def diff_scenarios(*, job: ServeJob):
    """The diff's scenarios, biggest change first (either way), unscored ones last."""
    return job.diff_scenarios.order_by(Abs(F("delta")).desc(nulls_last=True), "index")


def diff_summary(*, job: ServeJob) -> dict:
    rows: list[DiffScenario] = list(job.diff_scenarios.all())
    paired = [r for r in rows if r.delta is not None]

    def mean(values):
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None

    return {
        "scenarios": len(rows),
        "paired": len(paired),
        "mean_a": mean(r.reward_a for r in rows),
        "mean_b": mean(r.reward_b for r in rows),
        "mean_delta": mean(r.delta for r in paired),
        "improved": sum(1 for r in paired if r.delta > 0),
        "regressed": sum(1 for r in paired if r.delta < 0),
        "unchanged": sum(1 for r in paired if r.delta == 0),
    }
