"""Reads for runs, metrics, checkpoints, events, trajectories, dry runs, judge endpoints and quotas. Every read is
scoped to what the user may see, by the one rule of artweb.visibility."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import numpy as np
from django.db.models import Max, OuterRef, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.shortcuts import get_object_or_404
from django.utils import timezone
from rest_framework.authtoken.models import Token
from tsdownsample import MinMaxDownsampler

from artweb.visibility import own, visible
from training.charts import DEFAULT_SERIES, POINT_DIGITS
from training.models import (
    Checkpoint,
    DryRun,
    JudgeEndpoint,
    PretrainedModel,
    Run,
    RunEvent,
    RunLog,
    Step,
    Trajectory,
    TrajectoryGroup,
)
from training.selectors_quotas import (  # noqa: F401  (the quota reads, kept apart for this module's length)
    QUOTA_FIELDS,
    QUOTA_WINDOW,
    QuotaLine,
    quota_gpu_window_frees,
    quota_limits,
    quota_status,
    quota_steps_window_frees,
    quota_usage,
    share_weights,
    subquery_total,
)

# Series a run's charts and the metrics API can ask for (the charts' list: training.charts). Columns come
# from Step; the rest from Step.metrics (the engine's per-update figures) and Step.timings.
COLUMN_SERIES = ("reward_mean", "reward_std", "val_reward", "duration_s")


# What a runs list may be sorted by (the API takes each one); the page's Sort menu offers the labelled ones.
RUN_ORDERS = tuple(
    f"{sign}{name}"
    for name in ("created_at", "name", "status", "latest_reward", "best_val_reward", "steps_done")
    for sign in ("", "-")
)
RUN_ORDER_LABELS = {
    "-created_at": "Newest first",
    "created_at": "Oldest first",
    "name": "Name",
    "status": "Status",
    "-latest_reward": "Latest reward",
    "-best_val_reward": "Best validation reward",
    "-steps_done": "Progress",
}


# What a client-driven run shows where a run names its script: its rollouts run in an ART client.
CLIENT_TASK = "ART client"


def run_visible(user) -> QuerySet[Run]:
    return visible(Run.objects.all(), user)


def run_get(*, user, run_id: int) -> Run:
    """The run, or 404 when it does not exist or is not the user's (never 403: no existence leak)."""
    return get_object_or_404(run_visible(user).select_related("base_model", "scenario_set"), id=run_id)


def run_list(
    *,
    user,
    status: str | None = None,
    base_model: int | str | None = None,
    tag: str | None = None,
    q: str | None = None,
    order: str = "-created_at",
) -> QuerySet[Run]:
    qs = run_visible(user).select_related("base_model", "script_version__asset", "owner")
    if status:
        qs = qs.filter(status=status)
    if base_model:
        qs = (
            qs.filter(base_model_id=base_model) if str(base_model).isdigit() else qs.filter(base_model__name=base_model)
        )
    if tag:
        qs = qs.filter(tags__contains=[tag])
    if q:
        task = Q(script_version__asset__name__icontains=q)
        if q.strip() and q.strip().lower() in CLIENT_TASK.lower():  # the text of a client-driven run's Task column
            task |= Q(driver=Run.Driver.CLIENT)
        qs = qs.filter(Q(name__icontains=q) | task)
    return qs.order_by(order if order in RUN_ORDERS else "-created_at", "-id")


def run_client_summary(*, run: Run) -> dict | None:
    """What the run page says of a client-driven run (None for any other): the ART client's model that
    drives it (None once the client deleted it), its last call, and its training jobs. Read through the
    reverse relations of training.client_runs' models, which training never imports."""
    if run.driver != Run.Driver.CLIENT:
        return None
    model = getattr(run, "client_model", None)  # the reverse one-to-one raises AttributeError when absent
    jobs = run.client_jobs.all()
    contacted_at = model.contacted_at if model else None
    return {
        "model": str(model) if model else None,
        "inference_name": model.inference_name if model else None,
        "contacted_at": contacted_at,
        "contacted_just_now": contacted_at is not None and timezone.now() - contacted_at < timedelta(minutes=1),
        "jobs": jobs.count(),
        "last_job": jobs.order_by("-id").only("id", "status", "step", "error", "created_at").first(),
    }


def base_model_visible(user) -> QuerySet[PretrainedModel]:
    """The shared base models and the user's own (staff: every one)."""
    return visible(PretrainedModel.objects.all(), user)


def _downsample(x: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep the min and the max of each bucket so spikes survive (tsdownsample's MinMax)."""
    if max_points <= 0 or len(x) <= max_points:
        return x, y
    n_out = max(4, max_points - max_points % 2)
    idx = MinMaxDownsampler().downsample(x, y, n_out=n_out)
    return x[idx], y[idx]


# A series value picked out of a Step by PostgreSQL: a column as it is; otherwise the metrics key if present
# and not null (kept only when it is a number), else the timings key (when it is a number).
_SERIES_SQL = (
    "CASE coalesce(jsonb_typeof(metrics -> %s), 'null')"
    " WHEN 'number' THEN (metrics ->> %s)::float8"
    " WHEN 'null' THEN (CASE jsonb_typeof(timings -> %s) WHEN 'number' THEN (timings ->> %s)::float8 END)"
    " END"
)


def _series_full(*, run: Run, names: list[str], since_step: int | None = None) -> tuple[dict, int | None]:
    """({name: (steps, values)} at full resolution, the last step read): one query, in which only the
    asked-for numbers leave the database (decoding every step's metrics and timings JSON in Python was
    ~10x slower at 2,000 steps). Steps without a value for a series are left out of that series."""
    qs = Step.objects.filter(run=run).order_by("step")
    if since_step is not None:
        qs = qs.filter(step__gt=since_step)
    # Columns come as they are; a JSON-held series is an annotation named s<i>.
    exprs = {f"s{i}": RawSQL(_SERIES_SQL, (name,) * 4) for i, name in enumerate(names) if name not in COLUMN_SERIES}
    fields = [name if name in COLUMN_SERIES else f"s{i}" for i, name in enumerate(names)]
    rows = list(qs.annotate(**exprs).values_list("step", *fields))
    full = {}
    for col, name in enumerate(names, start=1):
        pairs = [(r[0], r[col]) for r in rows if r[col] is not None]
        x = np.fromiter((p[0] for p in pairs), dtype=np.int64, count=len(pairs))
        y = np.fromiter((p[1] for p in pairs), dtype=np.float64, count=len(pairs))
        full[name] = (x, y)
    return full, rows[-1][0] if rows else since_step


def run_metrics(
    *, run: Run, series: list[str] | None = None, since_step: int | None = None, max_points: int | None = None
) -> dict:
    """{"series": {name: {"x": [...steps], "y": [...]}}, "last_step": int|None}: the metrics API's answer
    and the compare page's, each series min/max-downsampled to max_points (None: every step)."""
    names = list(dict.fromkeys(series or DEFAULT_SERIES))
    full, last_step = _series_full(run=run, names=names, since_step=since_step)
    out: dict[str, dict] = {}
    for name, (x, y) in full.items():
        x, y = _downsample(x, y, max_points or 0)
        out[name] = {"x": x.tolist(), "y": [round(v, POINT_DIGITS) for v in y.tolist()]}
    return {"series": out, "last_step": last_step}


def run_chart_data(*, run: Run, max_points: int = 500) -> dict:
    """The run page's first paint: run_metrics of DEFAULT_SERIES plus the reward spread band, from the same
    query. The band takes reward_std at the very steps the downsampled reward_mean kept, so it is cut from
    the full-resolution series."""
    names = list(dict.fromkeys([*DEFAULT_SERIES, "reward_std"]))
    full, last_step = _series_full(run=run, names=names)
    series = {}
    for name in DEFAULT_SERIES:
        x, y = _downsample(*full[name], max_points)
        series[name] = {"x": x.tolist(), "y": [round(v, POINT_DIGITS) for v in y.tolist()]}
    std_x, std_y = full["reward_std"]
    std_by_step = dict(zip(std_x.tolist(), [round(v, POINT_DIGITS) for v in std_y.tolist()], strict=False))
    series["reward_band"] = {
        "x": series["reward_mean"]["x"],
        "std": [std_by_step.get(x) for x in series["reward_mean"]["x"]],
    }
    return {"series": series, "last_step": last_step}


def run_figures_get(*, run_id: int) -> Run | None:
    """The run with what its page's summary and its runs-list row show, checkpoint_count (its checkpoints,
    kept or deleted) included, or None if it is gone. One query; the caller has checked that the user may
    see the run."""
    checkpoints = subquery_total(Checkpoint.objects.filter(run=OuterRef("pk")), "COUNT", "id")
    runs = Run.objects.filter(id=run_id).select_related("base_model", "script_version__asset", "owner")
    return runs.annotate(checkpoint_count=checkpoints).first()


def checkpoint_rows(*, run_id: int, ids=(), steps=(), since: datetime | None = None) -> list[Checkpoint]:
    """The run's checkpoints among ids or steps, and those created or deleted since `since`: the rows a
    run page's Checkpoints tab is told of live or on catch-up. Newest step first."""
    changed = Q(id__in=list(ids)) | Q(step__in=list(steps))
    if since is not None:
        changed |= Q(created_at__gte=since) | Q(deleted_at__gte=since)
    return list(Checkpoint.objects.filter(changed, run_id=run_id).order_by("-step"))


def run_steps_since(*, run: Run, after_step: int = -1, limit: int = 2000) -> list[Step]:
    return list(Step.objects.filter(run=run, step__gt=after_step).order_by("step")[:limit])


def run_events_since(*, run: Run, after_id: int = 0, limit: int = 500) -> list[RunEvent]:
    # The actor comes along: the events API names who acted on each event.
    return list(RunEvent.objects.filter(run=run, id__gt=after_id).select_related("actor").order_by("id")[:limit])


def run_logs_since(*, run: Run, after_id: int = 0, limit: int = 500) -> list[RunLog]:
    return list(RunLog.objects.filter(run=run, id__gt=after_id).order_by("id")[:limit])


def checkpoint_list(*, run: Run) -> QuerySet[Checkpoint]:
    return Checkpoint.objects.filter(run=run).order_by("-step")


# --- added for the dashboard ---------------------------------------------------------------------


def run_warnings(*, run: Run, limit: int = 5) -> list[RunEvent]:
    """The run's newest warnings (events whose data says level "warning"), newest first: the page's banners."""
    return list(RunEvent.objects.filter(run=run, data__level="warning").order_by("-id")[:limit])


def run_events_recent(*, run: Run, limit: int = 100) -> list[RunEvent]:
    """The newest events, oldest first (the timeline's first paint; the socket appends the rest)."""
    return list(reversed(RunEvent.objects.filter(run=run).order_by("-id")[:limit]))


def run_logs_recent(*, run: Run, limit: int = 200) -> list[RunLog]:
    return list(reversed(RunLog.objects.filter(run=run).order_by("-id")[:limit]))


def run_trajectory_steps(*, run: Run) -> list[int]:
    """Steps of the run that have trajectory groups (the inspector's slider stops)."""
    return list(TrajectoryGroup.objects.filter(run=run).order_by("step").values_list("step", flat=True).distinct())


def checkpoint_get(*, user, checkpoint_id: int) -> Checkpoint:
    """A checkpoint of a run the user may see, or 404."""
    return get_object_or_404(
        Checkpoint.objects.filter(run__in=run_visible(user)).select_related("run"), id=checkpoint_id
    )


# --- trajectories, groups and dry runs -----------------------------------------------------------


def trajectory_list(
    *,
    run,
    step: int | None = None,
    split: str | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
    q: str | None = None,
    has_error: bool | None = None,
) -> QuerySet[Trajectory]:
    """Trajectories of a run (the caller has already checked access to the run)."""
    qs = Trajectory.objects.filter(run=run).select_related("group")
    if step is not None:
        qs = qs.filter(step=step)
    if split:
        qs = qs.filter(group__split=split)
    if min_reward is not None:
        qs = qs.filter(reward__gte=min_reward)
    if max_reward is not None:
        qs = qs.filter(reward__lte=max_reward)
    if q:
        qs = qs.filter(search_text__icontains=q)
    if has_error is not None:
        qs = qs.exclude(error="") if has_error else qs.filter(error="")
    return qs.order_by("step", "group_id", "index")


def group_list(*, run, step: int | None = None, split: str | None = None) -> QuerySet[TrajectoryGroup]:
    qs = TrajectoryGroup.objects.filter(run=run).select_related("scenario")
    if step is not None:
        qs = qs.filter(step=step)
    if split:
        qs = qs.filter(split=split)
    return qs.order_by("step", "id")


def trajectory_get(*, run, trajectory_id: int) -> Trajectory:
    """One trajectory of a run (the caller has already checked access to the run), or 404."""
    return get_object_or_404(Trajectory.objects.filter(run=run), id=trajectory_id)


def group_get(*, run, group_id: int) -> TrajectoryGroup:
    return get_object_or_404(TrajectoryGroup.objects.filter(run=run).select_related("scenario"), id=group_id)


def dry_run_get(*, user, dry_run_id: int) -> DryRun:
    return get_object_or_404(
        visible(DryRun.objects.all(), user).select_related(
            "script_version__asset", "reward_version__asset", "base_model"
        ),
        id=dry_run_id,
    )


def judge_endpoint_list(*, owner) -> QuerySet[JudgeEndpoint]:
    """The judge endpoints that owner's runs name as "endpoint:<name>": their own, staff too (a setting,
    artweb.visibility.own; staff manage everyone's in the admin)."""
    return own(JudgeEndpoint.objects.all(), owner)


def judge_endpoint_get(*, user, endpoint_id: int) -> JudgeEndpoint:
    """One of the user's own judge endpoints, or 404: someone else's reads as missing."""
    return get_object_or_404(judge_endpoint_list(owner=user), id=endpoint_id)


# --- live groups and the live runs list ------------------------------------------------------------

# Scored groups the run page keeps in its "Latest groups" list (first paint, catch-up and live alike).
GROUPS_SHOWN = 20


def group_extremes(trajectories) -> tuple:
    """(best, worst) scored trajectory of a group: the highest reward (first on a tie) and the lowest
    (last on a tie, so a group of equal rewards still shows two answers); (None, None) if none is scored."""
    scored = [t for t in trajectories if t.reward is not None and math.isfinite(t.reward)]
    if not scored:
        return None, None
    best = max(scored, key=lambda t: t.reward)
    worst = min(reversed(scored), key=lambda t: t.reward)
    return best, worst


def run_groups_latest(*, run_id: int, after_id: int = 0, ids=(), limit: int = GROUPS_SHOWN) -> list[tuple]:
    """[(group, its trajectories)], oldest first: the newest `limit` groups with id > after_id, and
    those of `ids` (at most `limit` of them). The caller has checked that the user may see the run.

    Three queries however many groups: transcripts are read only for each group's best and worst
    trajectory, the two its message quotes."""
    ids = [i for i in ids if isinstance(i, int) and not isinstance(i, bool)][:limit]
    groups = list(
        TrajectoryGroup.objects.filter(Q(id__gt=after_id) | Q(id__in=ids), run_id=run_id)
        .select_related("scenario")  # its index, the number the page shows
        .defer("scenario__data")
        .order_by("-id")[: limit + len(ids)]
    )
    newer = [g for g in groups if g.id > after_id][:limit]
    asked = [g for g in groups if g.id <= after_id]
    groups = sorted(newer + asked, key=lambda g: g.id)
    trajs = list(
        Trajectory.objects.filter(group__in=[g.id for g in groups])
        .order_by("group_id", "index")
        .only("id", "group_id", "index", "reward", "advantage", "error")
    )
    by_group: dict[int, list] = {g.id: [] for g in groups}
    for t in trajs:
        by_group[t.group_id].append(t)
    quoted = {t.id: t for ts in by_group.values() for t in group_extremes(ts) if t is not None}
    for tid, messages in Trajectory.objects.filter(id__in=list(quoted)).values_list("id", "messages"):
        quoted[tid].messages = messages  # fills the deferred field: no query when the message reads it
    return [(g, by_group[g.id]) for g in groups]


def run_latest_id(*, user) -> int:
    """The newest id among the runs the user may see (0 if none): the runs list's catch-up cursor."""
    return run_visible(user).aggregate(latest=Max("id"))["latest"] or 0


def runs_by_id(*, user, ids) -> QuerySet[Run]:
    """The user's runs among ids, with what a runs-list row shows."""
    return run_visible(user).filter(id__in=ids).select_related("base_model", "script_version__asset", "owner")


def api_token_get(*, user) -> Token | None:
    """The user's API token, if they have one."""
    return Token.objects.filter(user=user).first()
