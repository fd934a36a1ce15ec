"""Re-scoring: a run's stored trajectories scored again by another reward function version (or RULER),
without touching training.

The run's Steps, Checkpoints, trajectories and their rewards are only read. Scores go to RescoreScore
rows, one per trajectory, written a batch of whole steps at a time in one transaction, so a redelivered
task skips what is already scored and repeats nothing. User code runs only in the jail
(rollouts.sandbox.scores.run_scores), on the default queue: a reward function needs no model, and RULER
reaches a judge endpoint through the worker's proxy. A judge served by artweb itself (the run's base model,
or `model:<name>`) would need an inference server, which only the GPU workers hold: such re-scores are
refused with a message that says to add a judge endpoint. A re-score is a background job of the kind
RESCORE_JOBS (training.jobs): one whose worker stops heartbeating is queued again and goes on.

What "agreement" means here (the summary):
- spearman, kendall_tau: rank correlations between old and new rewards over the trajectories that have
  both (scipy.stats.spearmanr and kendalltau, tau-b: ties handled as scipy does);
- pair_agreement: the share of pairs within a group that both rewards order alike (a tie is an order of
  its own). GRPO learns from the order within a group, so this is the figure that says whether the new
  reward would have taught the same thing;
- mean_abs_diff: the mean |new - old|;
- rank_gap, per trajectory: |its rank under new - its rank under old| (average ranks); the largest first
  are the disagreements.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import defaultdict
from itertools import combinations

from django.db import transaction
from django.db.models import F, Max, QuerySet
from django.db.models.functions import Abs
from django.shortcuts import get_object_or_404
from django.urls import reverse

from artweb.errors import ApplicationError
from artweb.visibility import may_see, require_visible, visible
from rollouts.models import RewardFunctionVersion
from rollouts.sandbox.batch import SandboxLimits
from rollouts.sandbox.scores import ScoreGroup, ScoreRequest, run_scores
from rollouts.selectors import attachments_lookup
from training import task_names
from training.jobs.kinds import JobKind
from training.jobs.leases import JobHeartbeat, worker_name
from training.jobs.services import job_claim, job_enqueue, job_event, job_fail, job_finish
from training.models import PretrainedModel, Rescore, RescoreScore, Run, Trajectory, TrajectoryGroup
from training.services import inference
from training.services.judges import judge_resolve, judge_upstream
from training.services.runs import run_event
from training.services.steps import sandbox_unjailed_warn

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation")
# Whole steps are scored together up to about this many trajectories: one sandbox start per batch.
BATCH_TRAJECTORIES = 512
DISAGREEMENTS_KEPT = 20
ORDERINGS = {
    "disagreement": (
        F("rank_gap").desc(nulls_last=True),
        Abs(F("new_reward") - F("old_reward")).desc(nulls_last=True),
        "step",
        "trajectory_id",
    ),
    "step": ("step", "trajectory_id"),
    "old_reward": (F("old_reward").desc(nulls_last=True), "trajectory_id"),
    "new_reward": (F("new_reward").desc(nulls_last=True), "trajectory_id"),
    "errors": (F("error").desc(), "step", "trajectory_id"),
}
# A running re-score is claimable too: one whose worker is gone is taken over, from the scores it wrote.
RESCORE_JOBS = JobKind(
    name="rescores",
    model=Rescore,
    task=task_names.RESCORE_EXECUTE,
    claimable=(Rescore.Status.QUEUED, Rescore.Status.RUNNING),
)


# --- reads -----------------------------------------------------------------------------------------


def rescore_visible(user) -> QuerySet[Rescore]:
    """The re-scores the user may see: those they asked for (staff: every one)."""
    return visible(Rescore.objects.select_related("run", "reward_version__asset"), user)


def rescore_get(*, user, rescore_id: int) -> Rescore:
    """The re-score, or 404 when it does not exist or is not the user's."""
    return get_object_or_404(rescore_visible(user), id=rescore_id)


def rescore_list(*, user, run: Run) -> QuerySet[Rescore]:
    return rescore_visible(user).filter(run=run).order_by("-created_at", "-id")


def rescore_scores(*, rescore: Rescore, ordering: str = "disagreement") -> QuerySet[RescoreScore]:
    return RescoreScore.objects.filter(rescore=rescore).order_by(*ORDERINGS.get(ordering, ORDERINGS["disagreement"]))


def rescorable(*, run: Run, split: str, steps_done: int | None = None) -> QuerySet[Trajectory]:
    """The run's stored trajectories a re-score takes: those of committed steps, not of a failed attempt,
    whose rollout finished (a conversation to score; a rollout that failed has none)."""
    return Trajectory.objects.filter(
        run=run,
        group__split=split,
        group__failed_attempt=False,
        step__lte=run.steps_done if steps_done is None else steps_done,
    ).exclude(messages=[])


# --- create ----------------------------------------------------------------------------------------


def _judge(*, owner, value: str):
    """The JudgeEndpoint a RULER re-score uses; refuses judges served by artweb itself."""
    found = judge_resolve(owner=owner, value=value)
    if found is None or isinstance(found, PretrainedModel):
        raise ApplicationError(
            "RULER re-scoring needs a judge endpoint: a judge served by artweb (the run's base model or "
            "model:<name>) needs a GPU worker's inference server, which re-scoring does not use. Add an "
            "OpenAI-compatible server under Models → RULER judges and choose it as endpoint:<name>.",
            field_errors={"ruler_judge": ["choose an endpoint:<name> judge"]},
        )
    return found


@transaction.atomic
def rescore_create(
    *,
    user,
    run: Run,
    reward_version: RewardFunctionVersion | None = None,
    use_ruler: bool = False,
    ruler_judge: str = "",
    split: str = "train",
) -> Rescore:
    """Queue a re-score of what the run has stored now; the default queue's worker runs it."""
    require_visible(user, run, what="run", field="run")  # a re-score reads the run and changes nothing of it
    if split not in SPLITS:
        raise ApplicationError(
            f"split must be one of {', '.join(SPLITS)}, not {split!r}.", field_errors={"split": ["invalid"]}
        )
    if (reward_version is None) == (not use_ruler):
        raise ApplicationError(
            "Choose what scores the trajectories: a reward function version, or RULER with a judge (one of the two).",
            field_errors={"reward_version": ["give a reward function version or use_ruler"]},
        )
    if reward_version is not None and not may_see(user, reward_version, owner_field="asset__owner"):
        raise ApplicationError(
            "That reward function is not yours; choose one of your own reward functions.",
            field_errors={"reward_version": ["not found"]},
        )
    ruler_judge = (ruler_judge or "").strip()
    if use_ruler:
        _judge(owner=run.owner, value=ruler_judge)
    _attachments(run)
    if not rescorable(run=run, split=split).exists():
        raise ApplicationError(
            f"Nothing to re-score yet: run {run.name!r} has no stored {split} trajectories from a completed step "
            "(failed attempts and failed rollouts are left out). Wait for its first step"
            + (", or choose the train split." if split == "validation" else "."),
            field_errors={"run": ["no stored trajectories"]},
        )
    rescore = Rescore.objects.create(
        owner=user,
        run=run,
        reward_version=reward_version,
        use_ruler=use_ruler,
        ruler_judge=ruler_judge if use_ruler else "",
        split=split,
    )
    job_event(jobs=RESCORE_JOBS, job=rescore, kind="created", message="Re-score queued.", actor=user)
    run_event(
        run=run,
        kind="rescore",
        actor=user,
        data={"rescore": rescore.id, "link": _link(rescore)},
        message=f"Re-score #{rescore.id} queued ({rescore_label(rescore)}, {split} trajectories).",
    )
    _enqueue(rescore)
    return rescore


def _attachments(run: Run) -> dict:
    """name -> stored file of each data attachment the run names, bound at /data/<name> as in its steps, so a
    reward that reads one scores as it did there; one deleted since the run is refused, naming it."""
    names = run.config.get("attachments") or []
    files, missing = attachments_lookup(owner=run.owner, names=names)
    if missing:
        raise ApplicationError(
            f"The run {run.name!r} reads the data attachment {missing[0]!r} at /data/{missing[0]}, which has been "
            "deleted since: a reward that reads it could not score. Upload it again under the same name, then "
            "re-score.",
            field_errors={"run": [f"{name}: data attachment deleted" for name in missing]},
        )
    return files


def rescore_label(rescore: Rescore) -> str:
    if rescore.use_ruler:
        return f"RULER, judge {rescore.ruler_judge}"
    version = rescore.reward_version
    return f"{version.asset.name} v{version.number}" if version else "no reward"


def _link(rescore: Rescore) -> str:
    return reverse("rescore-detail", args=[rescore.id])


def _enqueue(rescore: Rescore) -> None:
    job_enqueue(jobs=RESCORE_JOBS, job=rescore)


# --- execute ---------------------------------------------------------------------------------------


def rescore_execute(*, rescore_id: int) -> None:
    """Score the run's stored trajectories (as of the job's start) batch by batch; then the summary.

    A queued re-score is claimed; a running one whose worker is gone (a redelivery, or the sweep's
    requeue) is taken over and goes on from the scores already written. A done or failed one, or one a
    live worker holds, is left alone."""
    me = worker_name()
    if not job_claim(jobs=RESCORE_JOBS, job_id=rescore_id, me=me):
        return
    rescore = Rescore.objects.select_related("run", "reward_version").get(id=rescore_id)
    try:
        with JobHeartbeat(RESCORE_JOBS, rescore.id, me):
            scope = _scope(rescore)
            for batch in _batches(rescore, scope):
                _score_batch(rescore, batch)
        _finish(rescore)
    except Exception as exc:
        logger.exception("re-score %s failed", rescore_id)
        _fail(rescore, f"{type(exc).__name__}: {exc}")


def _scope(rescore: Rescore) -> dict:
    """What this re-score covers, fixed when it first starts: the trajectories stored by then."""
    scope = (rescore.summary or {}).get("scope")
    if scope:
        return scope
    run = Run.objects.get(id=rescore.run_id)
    pool = rescorable(run=run, split=rescore.split)
    scope = {"steps_done": run.steps_done, "max_trajectory_id": pool.aggregate(m=Max("id"))["m"] or 0}
    total = pool.filter(id__lte=scope["max_trajectory_id"]).count()
    Rescore.objects.filter(id=rescore.id).update(summary={"scope": scope}, trajectories_total=total)
    rescore.summary, rescore.trajectories_total = {"scope": scope}, total
    return scope


def _pending(rescore: Rescore, scope: dict) -> QuerySet[Trajectory]:
    return (
        rescorable(run=rescore.run, split=rescore.split, steps_done=scope["steps_done"])
        .filter(id__lte=scope["max_trajectory_id"])
        .exclude(id__in=RescoreScore.objects.filter(rescore=rescore).values("trajectory_id"))
    )


def _batches(rescore: Rescore, scope: dict):
    """Lists of steps, whole steps together, about BATCH_TRAJECTORIES trajectories each."""
    counts = defaultdict(int)
    for step in _pending(rescore, scope).values_list("step", flat=True):
        counts[step] += 1
    batch, size = [], 0
    for step in sorted(counts):
        batch.append(step)
        size += counts[step]
        if size >= BATCH_TRAJECTORIES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _score_batch(rescore: Rescore, steps: list[int]) -> None:
    run = rescore.run
    trajs = list(
        _pending(rescore, rescore.summary["scope"])
        .filter(step__in=steps)
        .order_by("step", "group_id", "index")
        .only("id", "group_id", "step", "reward", "messages", "tools", "additional_histories", "metrics", "metadata")
    )
    by_group: dict[int, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_group[t.group_id].append(t)
    groups = {g.id: g for g in TrajectoryGroup.objects.filter(id__in=list(by_group)).select_related("scenario")}
    order = list(by_group)
    judge_model, judge = None, None
    if rescore.use_ruler:
        endpoint = _judge(owner=run.owner, value=rescore.ruler_judge)
        judge_model = endpoint.model
        judge = judge_upstream(endpoint)
    attachments = _attachments(run)
    jail = inference.jail_config()
    if not jail.jailed:
        sandbox_unjailed_warn(run=run)  # the run's timeline says so, once, as for its steps
    request = ScoreRequest(
        groups=[
            ScoreGroup(
                scenario=groups[gid].scenario.data,
                trajectories=[
                    {
                        "messages": t.messages,
                        "tools": t.tools,
                        "additional_histories": t.additional_histories,
                        "metrics": t.metrics,
                        "metadata": t.metadata,
                    }
                    for t in by_group[gid]
                ],
            )
            for gid in order
        ],
        reward=rescore.reward_version.content if rescore.reward_version else None,
        ruler=rescore.use_ruler,
        judge_model=judge_model,
        judge=judge,
        concurrency=int(run.config.get("concurrency") or 16),
        limits=SandboxLimits(rollout_timeout_s=float(run.config.get("rollout_timeout_s") or 120.0)),
        jail=jail,
        attachments=attachments,
    )
    results = run_scores(request)
    rows = [
        RescoreScore(
            rescore=rescore,
            trajectory_id=t.id,
            step=t.step,
            old_reward=t.reward,
            new_reward=score["reward"],
            error=score["error"] or "",
            reward_ms=score["reward_ms"],
            metrics=score["metrics"],
        )
        for gid, scores in zip(order, results, strict=False)
        for t, score in zip(by_group[gid], scores, strict=False)
    ]
    with transaction.atomic():
        RescoreScore.objects.bulk_create(rows, ignore_conflicts=True)
        done = RescoreScore.objects.filter(rescore=rescore).count()
        Rescore.objects.filter(id=rescore.id).update(trajectories_done=done)


def _finish(rescore: Rescore) -> None:
    rows = list(
        RescoreScore.objects.filter(rescore=rescore)
        .select_related(None)
        .values("id", "trajectory_id", "trajectory__group_id", "step", "old_reward", "new_reward", "error")
    )
    summary, gaps = rescore_summary(rows)
    summary["scope"] = rescore.summary["scope"]
    figure = f"Spearman {summary['spearman']:.3f}" if summary["spearman"] is not None else "no rank correlation"
    outcome = f"{len(rows)} trajectories, {figure}, {summary['errors']} errors."
    with transaction.atomic():
        RescoreScore.objects.bulk_update(
            [RescoreScore(id=i, rank_gap=g) for i, g in gaps.items()], ["rank_gap"], batch_size=2000
        )
        if not job_finish(
            jobs=RESCORE_JOBS, job=rescore, message=f"Done: {outcome}", summary=summary, trajectories_done=len(rows)
        ):
            return
        run_event(
            run=rescore.run,
            kind="rescore",
            data={"rescore": rescore.id, "link": _link(rescore)},
            message=f"Re-score #{rescore.id} done: {outcome}",
        )


def _fail(rescore: Rescore, error: str) -> None:
    with transaction.atomic():
        if not job_fail(jobs=RESCORE_JOBS, job=rescore, error=error):
            return
        run_event(
            run=rescore.run,
            kind="rescore",
            data={"rescore": rescore.id, "level": "warning", "link": _link(rescore)},
            message=f"Re-score #{rescore.id} failed: {error[:500]}",
        )


# --- the figures -----------------------------------------------------------------------------------


def _round(x: float | None, digits: int = 6) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), digits)


def rescore_summary(rows: list[dict]) -> tuple[dict, dict[int, float]]:
    """The agreement figures and the re-scored curve from score rows (keys: id, trajectory_id,
    trajectory__group_id, step, old_reward, new_reward, error); and each paired row's rank gap by row id."""
    from scipy.stats import kendalltau, rankdata, spearmanr

    paired = [r for r in rows if r["old_reward"] is not None and r["new_reward"] is not None]
    old = [r["old_reward"] for r in paired]
    new = [r["new_reward"] for r in paired]
    spearman = kendall = None
    if len(set(old)) > 1 and len(set(new)) > 1:  # a constant side has no ranking to correlate
        spearman = spearmanr(old, new).statistic
        kendall = kendalltau(old, new).statistic
    gaps: dict[int, float] = {}
    if paired:
        for r, o, n in zip(paired, rankdata(old), rankdata(new), strict=False):
            gaps[r["id"]] = float(abs(n - o))
    by_group = defaultdict(list)
    for r in paired:
        by_group[r["trajectory__group_id"]].append(r)
    agree = pairs = 0
    for members in by_group.values():
        for a, b in combinations(members, 2):
            pairs += 1
            agree += _sign(a["old_reward"] - b["old_reward"]) == _sign(a["new_reward"] - b["new_reward"])
    by_step = defaultdict(lambda: ([], []))
    for r in rows:
        if r["old_reward"] is not None:
            by_step[r["step"]][0].append(r["old_reward"])
        if r["new_reward"] is not None:
            by_step[r["step"]][1].append(r["new_reward"])
    steps = sorted(by_step)
    ranked = sorted(paired, key=lambda r: (-gaps[r["id"]], -abs(r["new_reward"] - r["old_reward"]), r["id"]))
    summary = {
        "trajectories": len(rows),
        "paired": len(paired),
        "errors": sum(1 for r in rows if r["error"]),
        "spearman": _round(spearman),
        "kendall_tau": _round(kendall),
        "pair_agreement": _round(agree / pairs) if pairs else None,
        "group_pairs": pairs,
        "mean_abs_diff": _round(statistics.fmean(abs(n - o) for o, n in zip(old, new, strict=False)))
        if paired
        else None,
        "old_mean": _round(statistics.fmean(old)) if paired else None,
        "new_mean": _round(statistics.fmean(new)) if paired else None,
        "curve": {
            "steps": steps,
            "old": [_round(statistics.fmean(by_step[s][0])) if by_step[s][0] else None for s in steps],
            "new": [_round(statistics.fmean(by_step[s][1])) if by_step[s][1] else None for s in steps],
        },
        "disagreements": [
            {
                "trajectory": r["trajectory_id"],
                "step": r["step"],
                "old_reward": r["old_reward"],
                "new_reward": r["new_reward"],
                "rank_gap": gaps[r["id"]],
            }
            for r in ranked[:DISAGREEMENTS_KEPT]
            if gaps[r["id"]] > 0 or r["new_reward"] != r["old_reward"]
        ],
    }
    return summary, gaps


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)
