"""Messages to the WebSocket groups of the run pages and of the runs list, sent only after the
transaction that wrote them commits.

The messages that carry a row or a figure (a scored trajectory group, a run of the list, a run's summary,
a checkpoint, a step's chart points) are built here, once: the live broadcast, the page's first paint and
a reconnecting page's catch-up all use the same builder, so the browser renders one shape whichever way
it reached it.

A message that moves a run's figures (a step committed, a status change, a checkpoint's event) is
followed by the figures as they are when it leaves: the run's summary for its page (with the step's or
the event's checkpoint row) and its row for the runs lists. Every field the first paint shows thus
arrives with the change that moved it, whichever service made the change.

Groups: `run_<id>` for one run's page; `runs_user_<id>` for a person's runs list and `runs_staff` for
the lists of those who see every run (staff: artweb.visibility). A staff member's socket joins only
`runs_staff`, so a run of their own reaches them once.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.template.defaultfilters import filesizeformat
from django.urls import reverse
from django.utils import timezone

from artweb.visibility import sees_everything
from training.charts import DEFAULT_SERIES, POINT_DIGITS
from training.models import Checkpoint, Run
from training.selectors import (
    CLIENT_TASK,
    COLUMN_SERIES,
    GROUPS_SHOWN,
    checkpoint_rows,
    group_extremes,
    run_figures_get,
    run_groups_latest,
)
from training.selectors_queue import run_queue_places

logger = logging.getLogger(__name__)

RUNS_STAFF_GROUP = "runs_staff"
# The longest text of an answer a group message carries; the inspector shows the whole transcript.
ANSWER_CHARS = 600


def run_group_name(run_id: int) -> str:
    return f"run_{run_id}"


def runs_user_group(user_id: int) -> str:
    return f"runs_user_{user_id}"


def runs_list_group(user) -> str:
    """The one runs-list group a person's socket joins: the one that carries every run they may see."""
    return RUNS_STAFF_GROUP if sees_everything(user) else runs_user_group(user.pk)


def runs_list_groups(owner_id: int) -> tuple[str, ...]:
    """Every runs-list group that may show a run of this owner: the owner's and the staff's."""
    return runs_user_group(owner_id), RUNS_STAFF_GROUP


def event_message(event) -> dict:
    """A timeline event as the run page receives it; a warning carries its level and its link."""
    data = event.data or {}
    message = {
        "type": "event",
        "id": event.id,
        "kind": event.kind,
        "message": event.message,
        "created_at": event.created_at.isoformat(),
    }
    if data.get("level"):
        message["level"] = data["level"]
    if data.get("link"):
        message["link"] = data["link"]
    if event.kind.startswith("checkpoint_") and isinstance(data.get("checkpoint"), int):
        message["checkpoint"] = data["checkpoint"]  # the row its page shows anew (run_broadcast)
    return message


def broadcast_now(group: str, message: dict) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, {"type": "run.message", "message": message})
    except Exception:
        logger.warning("broadcast to %s failed", group, exc_info=True)


def run_broadcast(run_id: int, message: dict, *, to_list: bool = False) -> None:
    """Queue a message for the run's page (and, with to_list, its owner's runs list) after commit, and
    after a message that moves the run's figures, the figures (figures_send)."""
    groups = [run_group_name(run_id)]
    if to_list:
        owner_id = Run.objects.filter(id=run_id).values_list("owner_id", flat=True).first()
        if owner_id is not None:
            groups += runs_list_groups(owner_id)

    def send():
        for group in groups:
            broadcast_now(group, message)
        if _moves_figures(message):
            figures_send(run_id, checkpoint_ids=_checkpoint_ids(message), steps=_steps(message), to_list=to_list)

    transaction.on_commit(send)


def run_figures_broadcast(*, run_id: int) -> None:
    """After commit, tell the run's page and the runs lists its figures: for a service that changes one
    without sending a step, status or checkpoint event message."""
    transaction.on_commit(lambda: figures_send(run_id, to_list=True))


def _moves_figures(message: dict) -> bool:
    """A step (progress, rewards, a checkpoint), a status (started, finished, an error) or a checkpoint's
    event (deleted, promoted)."""
    return message.get("type") in ("step", "status") or (message.get("type") == "event" and "checkpoint" in message)


def _checkpoint_ids(message: dict) -> tuple[int, ...]:
    return (message["checkpoint"],) if isinstance(message.get("checkpoint"), int) else ()


def _steps(message: dict) -> tuple[int, ...]:
    """A step message's step: its checkpoint is written with it."""
    return (message["step"],) if message.get("type") == "step" and isinstance(message.get("step"), int) else ()


def figures_send(run_id: int, *, checkpoint_ids=(), steps=(), to_list: bool = False) -> None:
    """Send the run's figures as they are now: its summary (and the named checkpoints' rows) to its page,
    with to_list its row to the runs lists. Called after the commit; the message before it has left
    already, so a failed read costs only this."""
    try:
        run = run_figures_get(run_id=run_id)
        if run is None:
            return
        rows = checkpoint_rows(run_id=run_id, ids=checkpoint_ids, steps=steps) if checkpoint_ids or steps else []
    except Exception:
        logger.warning("reading run %s's figures failed", run_id, exc_info=True)
        return
    broadcast_now(run_group_name(run_id), summary_message(run, checkpoints=run.checkpoint_count))
    for row in rows:
        broadcast_now(run_group_name(run_id), checkpoint_message(row))
    if to_list:
        row = run_row_message(run)
        for group in runs_list_groups(run.owner_id):
            broadcast_now(group, row)


def runs_list_broadcast(*, owner_id: int, message: dict) -> None:
    """Queue a message for the runs lists that may show a run of owner_id, after commit."""

    def send():
        for group in runs_list_groups(owner_id):
            broadcast_now(group, message)

    transaction.on_commit(send)


# --- the fair queue's places ---------------------------------------------------------------------------


def queue_message(run_id: int, place) -> dict:
    """A run's place in the fair queue (training.selectors_queue.QueuePlace), or None: it is not waiting."""
    return {
        "type": "queue",
        "run": run_id,
        "place": place.place if place else None,
        "ahead": place.ahead if place else None,
        "reason": place.reason if place else "",
    }


def queue_broadcast(*, left: Sequence[int] = ()) -> None:
    """After commit, tell every waiting run's page and runs lists its place in the fair queue, and the runs in
    `left` (just claimed by a worker, paused, finished) that they are out of it. A turn taken or a step
    recorded moves every waiting run's place, so all of them are told."""
    left = tuple(left)
    transaction.on_commit(lambda: queue_send(left=left))


def queue_send(*, left: Sequence[int] = ()) -> None:
    try:
        places = run_queue_places()
        ids = set(places) | set(left)
        owners = dict(Run.objects.filter(id__in=ids).values_list("id", "owner_id")) if ids else {}
    except Exception:
        logger.warning("reading the queue's places failed", exc_info=True)
        return
    for run_id, owner_id in owners.items():
        message = queue_message(run_id, places.get(run_id))
        broadcast_now(run_group_name(run_id), message)
        for group in runs_list_groups(owner_id):
            broadcast_now(group, message)


# --- row messages ------------------------------------------------------------------------------------


def _finite(x):
    """A number JSON can carry: NaN and infinities become None (the browser's JSON.parse rejects them)."""
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _when(moment) -> str | None:
    """A time as the pages show it: ISO 8601 in the server's time zone, whose wall clock to the minute is
    what they print (first paint and live alike)."""
    return timezone.localtime(moment).isoformat() if moment else None


def _run_figures(run) -> dict:
    """What both the run page's summary and the run's row in the runs list show."""
    return {
        "status": run.status,
        "steps_done": run.steps_done,
        "num_steps": run.num_steps,
        "latest_reward": _finite(run.latest_reward),
        "best_val_reward": _finite(run.best_val_reward),
        "started_at": _when(run.started_at),
    }


def run_row_message(run) -> dict:
    """A run as one row of the runs list: its first paint and its live updates. Reads run.base_model,
    run.script_version.asset and run.owner: select_related them when building many."""
    return {
        "type": "run",
        "run": run.id,
        "name": run.name,
        "tags": list(run.tags),
        **_run_figures(run),
        "base_model": run.base_model.name,
        # A client-driven run has no script: its rollouts run in the ART client (training.client_runs).
        "task": run.script_version.asset.name if run.script_version else CLIENT_TASK,
        "task_version": run.script_version.number if run.script_version else None,
        "owner": run.owner.get_username(),
        "created_at": _when(run.created_at),
    }


def run_summary(run, *, checkpoints: int) -> dict:
    """The run page's figures besides its charts: status and progress, the latest and the best validation
    reward, when it started, its error, and how many checkpoints its Checkpoints tab lists (kept or
    deleted). The first paint's (training.views.runs), a summary message's and a catch-up's."""
    return {**_run_figures(run), "error": run.error, "checkpoints": checkpoints}


def summary_message(run, *, checkpoints: int) -> dict:
    return {"type": "summary", "run": run.id, **run_summary(run, checkpoints=checkpoints)}


def checkpoint_message(checkpoint: Checkpoint) -> dict:
    """A row of the run page's Checkpoints tab, first paint and live: download is the adapter's archive,
    for a checkpoint whose files are kept."""
    kept = checkpoint.state == Checkpoint.State.ACTIVE
    return {
        "type": "checkpoint",
        "run": checkpoint.run_id,
        "id": checkpoint.id,
        "step": checkpoint.step,
        "state": checkpoint.state,
        "promoted": checkpoint.promoted,
        "size": filesizeformat(checkpoint.size_bytes),
        "val_reward": _finite(checkpoint.val_reward),
        "created_at": _when(checkpoint.created_at),
        "download": reverse("checkpoint-download", args=[checkpoint.run_id, checkpoint.id]) if kept else None,
    }


def status_message(
    *, run_id: int, status: str, steps_done: int, num_steps: int, error: str, actions: list[str]
) -> dict:
    """The run's status and progress, for its page and the runs list (live, and first on catch-up), with
    the actions its status allows (training.services.runs.run_status_message): the page's buttons."""
    return {
        "type": "status",
        "run": run_id,
        "status": status,
        "steps_done": steps_done,
        "num_steps": num_steps,
        "error": error,
        "actions": actions,
    }


def log_message(line) -> dict:
    """A RunLog line for the run page's log view."""
    return {
        "type": "log",
        "id": line.id,
        "level": line.level,
        "message": line.message,
        "step": line.step,
        "created_at": line.created_at.isoformat(),
    }


def step_series(step) -> dict:
    """The step's point on each chart: {series: value or None}, by the rule of the first paint's query
    (training.selectors._SERIES_SQL): a Step column as it is; else the metrics key when it is not null,
    kept if a number, else the timings key if a number (a boolean is no number; nor, for JSON, NaN)."""
    metrics, timings = step.metrics or {}, step.timings or {}
    points = {}
    for name in DEFAULT_SERIES:
        if name in COLUMN_SERIES:
            value = _finite(getattr(step, name))
        elif metrics.get(name) is not None:
            value = _finite(metrics[name])
        else:
            value = _finite(timings.get(name))
        points[name] = None if value is None else round(value, POINT_DIGITS)
    return points


def step_message(step, *, steps_done: int | None, num_steps: int | None) -> dict:
    """A committed step for the run page and the runs list, live and on catch-up alike: its point on each
    chart (series), the Step row's metrics with its reward columns and duration, and the run's progress."""
    return {
        "type": "step",
        "run": step.run_id,
        "step": step.step,
        "series": step_series(step),
        "metrics": {
            **step.metrics,
            "reward_mean": step.reward_mean,
            "reward_std": step.reward_std,
            "val_reward": step.val_reward,
            "duration_s": step.duration_s,
        },
        "timings": step.timings,
        "steps_done": steps_done,
        "num_steps": num_steps,
    }


def final_answer(messages: list | None) -> str:
    """The text of the last assistant turn (its tool calls when it has no text), cut to ANSWER_CHARS."""
    for m in reversed(messages or []):
        if not isinstance(m, dict) or m.get("role") != "assistant":
            continue
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
        text = content.strip() if isinstance(content, str) else ""
        if not text:
            calls = [((c or {}).get("function") or {}) for c in m.get("tool_calls") or []]
            text = "; ".join(f"{fn.get('name', '?')}({fn.get('arguments', '')})" for fn in calls)
        return text if len(text) <= ANSWER_CHARS else text[: ANSWER_CHARS - 1] + "…"
    return ""


def _answer(traj) -> dict | None:
    if traj is None:
        return None
    return {
        "trajectory": traj.id,
        "index": traj.index,
        "reward": _finite(traj.reward),
        "advantage": _finite(traj.advantage),
        "text": final_answer(traj.messages),
        "error": (traj.error or "")[:300],
    }


def group_message(group, trajectories: Sequence) -> dict:
    """One scored group for the run page: per-trajectory rewards and advantages, the best and the worst
    answer.

    trajectories: the group's Trajectory rows. Only the two that training.selectors.group_extremes picks
    need `messages` loaded. `advantages` is None until the step's update has stored them (the group is
    sent when it is persisted, and again once its advantages are known); a list, index-aligned with
    `rewards`, after.
    """
    trajs = sorted(trajectories, key=lambda t: t.index)
    advantages = [_finite(t.advantage) for t in trajs]
    best, worst = group_extremes(trajs)
    return {
        "type": "group",
        "run": group.run_id,
        "id": group.id,
        "step": group.step,
        "split": group.split,
        "scenario": group.scenario_id,
        # The number pages show for the scenario (the inspector, the heatmap, the scenario set's page).
        "scenario_index": group.scenario.index,
        "reward_mean": _finite(group.reward_mean),
        "reward_std": _finite(group.reward_std),
        "error_count": group.error_count,
        "skipped": group.skipped,
        "failed_attempt": group.failed_attempt,
        "rewards": [_finite(t.reward) for t in trajs],
        "advantages": advantages if any(a is not None for a in advantages) else None,
        "best": _answer(best),
        "worst": _answer(worst) if worst is not best else None,
    }


def run_group_messages(
    *, run_id: int, after_id: int = 0, ids: Sequence[int] = (), limit: int | None = None
) -> list[dict]:
    """Group messages of a run, oldest first: the newest `limit` groups after after_id, plus the groups
    named in ids (ones a page shows without advantages yet, which may have them now)."""
    rows = run_groups_latest(run_id=run_id, after_id=after_id, ids=ids, limit=limit or GROUPS_SHOWN)
    return [group_message(group, trajs) for group, trajs in rows]
