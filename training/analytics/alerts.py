"""Alerts: the run says when it has nothing to learn from, or is learning the wrong thing.

After each committed step every rule of the run's AlertRules (RunConfig.alerts) looks at the steps'
stored metrics. A rule that holds at this step and did not at the step before raises one alert: an
event with level "warning" (a banner on the run page, live and on load), a link to the inspector and
example trajectories. With pause_on_alert, the run also pauses after the step.

Rules read only Step rows (the metrics the step computed from its rollouts), so re-evaluating them at
any step gives the same answer, and a constructed run's metrics are enough to test each one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlencode

from django.db import transaction
from django.db.models import F
from django.urls import reverse
from pydantic import ValidationError

from artweb.errors import ApplicationError
from training.config import AlertRules, RunConfig
from training.models import Run, RunEvent, Step, Trajectory, TrajectoryGroup
from training.services.runs import run_event, run_pause

EXAMPLES = 3  # example trajectories (or groups) named by an alert
LENGTH_WINDOW = 3  # steps averaged at each end to compare completion lengths
COLUMNS = ("reward_mean", "reward_std", "val_reward")  # Step columns, also in its metrics since they exist


@dataclass
class Alert:
    rule: str
    message: str
    query: dict = field(default_factory=dict)  # the inspector's filters that show the evidence
    trajectory_ids: list[int] = field(default_factory=list)
    group_ids: list[int] = field(default_factory=list)
    data: dict = field(default_factory=dict)


def _m(row: Step, name: str) -> float | None:
    value = (row.metrics or {}).get(name)
    if value is None and name in COLUMNS:
        value = getattr(row, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _consecutive(rows: Sequence[Step], n: int) -> Sequence[Step] | None:
    """The last n rows when they are n consecutive steps, else None."""
    if n < 1 or len(rows) < n:
        return None
    tail = rows[-n:]
    return tail if tail[-1].step - tail[0].step == n - 1 else None


# --- the rules: each says whether it holds at the last of `rows` (all the run's steps so far) -----------


def no_signal(rules: AlertRules, rows: Sequence[Step]) -> Alert | None:
    tail = _consecutive(rows, rules.no_signal_steps)
    if not tail or not all((_m(r, "groups") or 0) > 0 and _m(r, "groups_no_signal") == _m(r, "groups") for r in tail):
        return None
    first, last = tail[0].step, tail[-1].step
    means = {round(r.reward_mean, 4) for r in tail if r.reward_mean is not None}
    same = (
        f" (every rollout scored {means.pop():g})" if len(means) == 1 and all(r.reward_std == 0 for r in tail) else ""
    )
    return Alert(
        "no_signal",
        (
            f"No learning signal in steps {first}-{last}: in every group all rollouts got the same reward{same}, so GRPO "
            "had nothing to compare and the model did not change. Check that the reward function gives partial "
            "credit (spread within a group), or raise temperature or group_size; the example groups show what "
            "the rollouts answered."
        ),
        {"step": last, "split": "train"},
        data={"steps": [r.step for r in tail]},
    )


def reward_flat(rules: AlertRules, rows: Sequence[Step]) -> Alert | None:
    n = rules.flat_reward_steps
    tail = _consecutive(rows, n) if n >= 2 else None
    values = [_m(r, "reward_mean") for r in tail or ()]
    if not tail or None in values or max(values) - min(values) >= rules.flat_reward_delta:
        return None
    return Alert(
        "reward_flat",
        (
            f"The train reward stayed between {min(values):.3f} and {max(values):.3f} for steps "
            f"{tail[0].step}-{tail[-1].step} (less than {rules.flat_reward_delta:g} apart): the run has stopped "
            "improving. A higher learning rate, more scenarios per step or a reward with finer steps may help; "
            "if the reward is at its maximum, the run is done."
        ),
        {"step": tail[-1].step, "split": "train"},
    )


def _token_mean(row: Step, name: str) -> float | None:
    """A mean over the step's trained tokens, None where it trained none: a step whose groups all scored
    alike has no entropy (steps recorded before the trainer said so stored 0.0 there)."""
    return None if _m(row, "tokens_trained") == 0 else _m(row, name)


def entropy_collapse(rules: AlertRules, rows: Sequence[Step]) -> Alert | None:
    if rules.entropy_collapse <= 0:
        return None
    first = next((v for r in rows if (v := _token_mean(r, "entropy")) is not None), None)
    now = _token_mean(rows[-1], "entropy")
    if first is None or now is None or first <= 0 or now >= rules.entropy_collapse * first:
        return None
    return Alert(
        "entropy_collapse",
        (
            f"The policy's token entropy fell to {now:.3g}, from {first:.3g} at the first step (below "
            f"{rules.entropy_collapse:g} of it): the model now samples nearly the same answer every time, so "
            "groups stop differing and learning stalls. Lower the learning rate, or raise temperature."
        ),
        {"step": rows[-1].step, "split": "train"},
    )


def truncation(rules: AlertRules, rows: Sequence[Step]) -> Alert | None:
    share = _m(rows[-1], "truncation_rate")
    if not 0 < rules.truncation_share < 1 or share is None or share <= rules.truncation_share:
        return None
    return Alert(
        "truncation",
        (
            f"{share:.0%} of step {rows[-1].step}'s rollouts stopped at max_tokens (more than "
            f"{rules.truncation_share:.0%}): their answers are cut off, and the reward scores unfinished text. "
            "Raise max_tokens, or reward shorter answers."
        ),
        {"step": rows[-1].step, "split": "train"},
        data={"example": "truncated"},
    )


def heldout_divergence(rules: AlertRules, rows: Sequence[Step]) -> Alert | None:
    n = rules.heldout_divergence
    vals = [(i, v) for i, r in enumerate(rows) if (v := _m(r, "val_reward")) is not None]
    if n < 1 or len(vals) < n + 1 or vals[-1][0] != len(rows) - 1:
        return None

    def train_between(lo: int, hi: int) -> float | None:
        values = [v for r in rows[lo + 1 : hi + 1] if (v := _m(r, "reward_mean")) is not None]
        return statistics.fmean(values) if values else None

    points = vals[-(n + 1) :]
    starts = [vals[-(n + 2)][0] if len(vals) > n + 1 else -1] + [i for i, _ in points[:-1]]
    trains = [train_between(lo, hi) for lo, (hi, _) in zip(starts, points, strict=False)]
    if None in trains:
        return None
    for k in range(1, len(points)):
        if not (trains[k] > trains[k - 1] and points[k][1] < points[k - 1][1]):
            return None
    steps = [rows[i].step for i, _ in points]
    return Alert(
        "heldout_divergence",
        (
            f"Across the last {n + 1} validations (steps {', '.join(map(str, steps))}) the train reward rose "
            f"({trains[0]:.3f} → {trains[-1]:.3f}) while the held-out reward fell ({points[0][1]:.3f} → "
            f"{points[-1][1]:.3f}): the policy is fitting the training scenarios (or gaming their reward) rather "
            "than the task. Compare the held-out answers with earlier ones."
        ),
        {"step": steps[-1], "split": "validation"},
        data={"steps": steps},
    )


def length_drift(rules: AlertRules, rows: Sequence[Step]) -> Alert | None:
    f = rules.length_drift
    if f <= 1 or len(rows) < 2 * LENGTH_WINDOW:
        return None
    start = [v for r in rows[:LENGTH_WINDOW] if (v := _m(r, "completion_tokens_mean")) is not None]
    end = [v for r in rows[-LENGTH_WINDOW:] if (v := _m(r, "completion_tokens_mean")) is not None]
    if not start or not end:
        return None
    before, now = statistics.fmean(start), statistics.fmean(end)
    if before <= 0 or (now <= f * before and now * f >= before):
        return None
    # A length change that comes with a better held-out reward is the task being learned (a reward for
    # brevity shortens answers); one without it is what a gamed reward looks like.
    vals = [v for r in rows if (v := _m(r, "val_reward")) is not None]
    if len(vals) >= 2 and vals[-1] > vals[0]:
        return None
    held_out = (
        f"while the held-out reward did not improve ({vals[0]:.3f} → {vals[-1]:.3f})"
        if len(vals) >= 2
        else "with no validation to show whether the task is being learned"
    )
    way = "grew" if now > before else "shrank"
    return Alert(
        "length_drift",
        (
            f"Completions {way} from {before:.1f} tokens on average (steps {rows[0].step}-"
            f"{rows[LENGTH_WINDOW - 1].step}) to {now:.1f} (steps {rows[-LENGTH_WINDOW].step}-{rows[-1].step}), "
            f"more than a factor {f:g}, {held_out}: the reward may be paying for length rather than quality. Read "
            f"the {'longest' if now > before else 'shortest'} answers."
        ),
        {"step": rows[-1].step, "split": "train"},
        data={"example": "longest" if now > before else "shortest"},
    )


def component_dominance(rules: AlertRules, rows: Sequence[Step]) -> Alert | None:
    m = rows[-1].metrics or {}
    share, name = _m(rows[-1], "component_top_share"), m.get("component_top")
    if not 0 < rules.component_share < 1 or share is None or share <= rules.component_share or not name:
        return None
    return Alert(
        "component_dominance",
        (
            f"One part of the reward, {name!s:.100}, carries {share:.0%} of it at step {rows[-1].step}: the policy "
            "may be collecting that part alone (formatting, length, a keyword) rather than solving the task. "
            "Check that the other parts are still earned."
        ),
        {"step": rows[-1].step, "split": "train"},
        data={"component": str(name)[:100], "example": "component"},
    )


def repeated_answer(rules: AlertRules, rows: Sequence[Step]) -> Alert | None:
    m = rows[-1].metrics or {}
    share, text = _m(rows[-1], "answer_repeat_share"), m.get("answer_repeat_text")
    if not 0 < rules.repeated_answer_share < 1 or share is None or share <= rules.repeated_answer_share or not text:
        return None
    return Alert(
        "repeated_answer",
        (
            f"The same answer appears in {share:.0%} of step {rows[-1].step}'s scenarios: {str(text)[:120]!r}. "
            "An answer that fits every question is usually one the reward pays for by mistake."
        ),
        {"step": rows[-1].step, "split": "train", "q": str(text)[:100]},
        data={"answer": str(text)[:200]},
    )


RULES: dict[str, Callable[[AlertRules, Sequence[Step]], Alert | None]] = {
    "no_signal": no_signal,
    "reward_flat": reward_flat,
    "entropy_collapse": entropy_collapse,
    "truncation": truncation,
    "heldout_divergence": heldout_divergence,
    "length_drift": length_drift,
    "component_dominance": component_dominance,
    "repeated_answer": repeated_answer,
}
EVENT_KINDS = {name: name if name == "no_signal" else f"alert_{name}" for name in RULES}


# --- evaluation -------------------------------------------------------------------------------------


def _examples(run: Run, alert: Alert) -> None:
    step, split = alert.query.get("step"), alert.query.get("split", "train")
    trajs = Trajectory.objects.filter(run=run, step=step, group__split=split, group__failed_attempt=False)
    example = alert.data.get("example")
    if example == "truncated":
        trajs = trajs.filter(truncated=True)
    elif example == "longest":
        trajs = trajs.order_by("-completion_tokens")
    elif example == "shortest":
        trajs = trajs.order_by("completion_tokens")
    elif example == "component":
        trajs = trajs.order_by(F(f"metrics__{alert.data['component']}").desc(nulls_last=True))
    elif "q" in alert.query:
        trajs = trajs.filter(search_text__icontains=alert.query["q"])
    alert.trajectory_ids = list(trajs.values_list("id", flat=True)[:EXAMPLES])
    steps = alert.data.get("steps") or [step]
    alert.group_ids = list(
        TrajectoryGroup.objects.filter(run=run, step__in=steps, split=split, failed_attempt=False)
        .order_by("-step", "id")
        .values_list("id", flat=True)[:EXAMPLES]
    )


def run_alerts_check(*, run: Run, step: int) -> list[RunEvent]:
    """Evaluate the run's rules at `step` (just committed); write an event for each that starts to hold,
    and pause the run when its rules say so."""
    rules = RunConfig.model_validate(run.config).alerts
    rows = list(
        Step.objects.filter(run=run, step__lte=step)
        .order_by("step")
        .only("step", "metrics", "val_reward", "reward_mean", "reward_std")
    )
    if not rows or rows[-1].step != step:
        return []
    events = []
    for name, rule in RULES.items():
        alert = rule(rules, rows)
        if alert is None or (len(rows) > 1 and rule(rules, rows[:-1]) is not None):
            continue  # quiet, or the same streak already warned
        _examples(run, alert)
        link = reverse("run-trajectories", args=[run.id]) + "?" + urlencode(alert.query)
        events.append(
            run_event(
                run=run,
                kind=EVENT_KINDS[name],
                message=alert.message,
                data={
                    **alert.data,
                    "level": "warning",
                    "rule": name,
                    "step": step,
                    "link": link,
                    "trajectory_ids": alert.trajectory_ids,
                    "group_ids": alert.group_ids,
                },
            )
        )
    if events and rules.pause_on_alert:
        run.refresh_from_db()
        try:
            run_pause(run=run)
        except ApplicationError:
            pass  # finished or stopping meanwhile: nothing left to pause
    return events


def alert_rules(run: Run) -> dict:
    """Every rule of the run with its value (defaults for runs started before a rule existed)."""
    return RunConfig.model_validate(run.config).alerts.model_dump()


def run_alert_rules_update(*, run: Run, changes: dict, actor=None) -> AlertRules:
    """Change some of a run's alert rules (while it runs, too); the rest keep their values. Bad values are
    refused with the setting named, and nothing is saved."""
    if not isinstance(changes, dict):
        raise ApplicationError('Alert rules must be an object of settings, such as {"no_signal_steps": 5}.')
    with transaction.atomic():
        config = dict(Run.objects.select_for_update().values_list("config", flat=True).get(id=run.id))
        parsed = _parse_alerts({**config.get("alerts", {}), **changes})
        config["alerts"] = parsed.model_dump()
        Run.objects.filter(id=run.id).update(config=config)
    run.config = config
    run_event(
        run=run,
        kind="alert_rules_changed",
        actor=actor,
        data={"changes": sorted(changes)},
        message="Alert rules changed: "
        + ", ".join(f"{k} = {parsed.model_dump()[k]!r}" for k in sorted(changes) if k in type(parsed).model_fields),
    )
    return parsed


def _parse_alerts(data: dict) -> AlertRules:
    try:
        return AlertRules.model_validate(data)
    except ValidationError as exc:
        field_errors: dict[str, list[str]] = {}
        for err in exc.errors():
            name = str(err["loc"][0]) if err["loc"] else "alerts"
            field_errors.setdefault(name, []).append(err["msg"])
        summary = "; ".join(f"{f}: {msgs[0]}" for f, msgs in field_errors.items())
        raise ApplicationError(f"Invalid alert rules: {summary}", field_errors=field_errors) from exc
