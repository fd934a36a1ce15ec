"""Reads for a run's reward-health panel: how the reward function fails, how long it takes, where it is slow.

Everything is aggregated by PostgreSQL (counts, percentile_cont, the first example of each error), so a
run of thousands of steps costs a handful of queries whatever its size. The figures cover every
trajectory of the run in the step range, train and validation, failed attempts included: an error in an
attempt that failed is often the reason it failed.

Errors are told apart by the prefix the sandbox gives them (rollouts/sandbox/guest):
- "reward": "The reward function failed: <ExceptionType>: message", the reward raised;
- "timeout": "Timed out: the reward did not finish ..." or "Timed out: score_group did not finish ...";
- "rollout": anything else, the script (or the sandbox around it) failed before a reward could run.
A reward that was not a finite number is its own kind, whatever exception the sandbox raised to say so:
"reward was NaN", "reward was infinite" (inf or -inf), "reward was not a number". Any other error's type
is the exception's name when the message starts with one, else the message's first line with its numbers
replaced by N (so "within 20 s" and "within 30 s" count as one kind).
"""

from __future__ import annotations

from django.db import connection
from django.urls import reverse

from rollouts.sandbox.records import REWARD_ERROR_PREFIX as REWARD_PREFIX
from rollouts.sandbox.records import REWARD_TIMEOUT_PREFIXES as REWARD_TIMEOUTS
from training.models import Run, Trajectory

SLOWEST_SHOWN = 10
STAGES = ("reward", "timeout", "rollout")  # the order the error table lists them in
TYPE_CHARS = 80  # longest error type shown (a first line used as the type is cut here)

# The stage of t.error, as SQL. %s: REWARD_PREFIX%, then each of REWARD_TIMEOUTS%.
_STAGE_SQL = (
    "CASE WHEN t.error LIKE %s THEN 'reward' WHEN t.error LIKE %s OR t.error LIKE %s THEN 'timeout' ELSE 'rollout' END"
)
# A reward that is not a finite number, as the sandbox words it (artweb_sdk.trajectory.check_reward raises
# ValueError for NaN and infinities, TypeError for anything else): the kind, and the errors' beginnings.
_BAD_VALUE = REWARD_PREFIX + "{exc}: a reward must be a finite number or None, got {value}"
BAD_REWARD_KINDS = (
    ("reward was NaN", (_BAD_VALUE.format(exc="ValueError", value="nan"),)),
    (
        "reward was infinite",
        (_BAD_VALUE.format(exc="ValueError", value="inf"), _BAD_VALUE.format(exc="ValueError", value="-inf")),
    ),
    ("reward was not a number", (_BAD_VALUE.format(exc="TypeError", value=""),)),
)
# The error's kind, as SQL: one of BAD_REWARD_KINDS, else the exception's name, else the first line with its
# numbers folded. %s: each kind's prefixes% then its label (in order), then REWARD_PREFIX% and its length.
_TYPE_SQL = (
    "CASE "
    + "".join(
        "WHEN " + " OR ".join(["t.error LIKE %s"] * len(prefixes)) + " THEN %s " for _, prefixes in BAD_REWARD_KINDS
    )
    + "ELSE coalesce("
    "substring(split_part(CASE WHEN t.error LIKE %s THEN substr(t.error, %s) ELSE t.error END, E'\\n', 1) "
    "FROM '^([A-Za-z_][A-Za-z0-9_.]*)(?::|$)'), "
    "regexp_replace(left(split_part(t.error, E'\\n', 1), %s), '[0-9]+([.][0-9]+)?', 'N', 'g')) END"
)


def _like(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _stage_params() -> list:
    return [_like(REWARD_PREFIX), *(_like(p) for p in REWARD_TIMEOUTS)]


def _type_params() -> list:
    kinds = [param for label, prefixes in BAD_REWARD_KINDS for param in (*map(_like, prefixes), label)]
    return [*kinds, _like(REWARD_PREFIX), len(REWARD_PREFIX) + 1, TYPE_CHARS]


def _where(run: Run, step_from: int | None, step_to: int | None) -> tuple[str, list]:
    sql, params = "t.run_id = %s", [run.id]
    if step_from is not None:
        sql, params = sql + " AND t.step >= %s", [*params, step_from]
    if step_to is not None:
        sql, params = sql + " AND t.step <= %s", [*params, step_to]
    return sql, params


def trajectory_link(run_id: int, step: int, trajectory_id: int) -> str:
    """The trajectory open in the inspector, at its step."""
    return f"{reverse('run-trajectories', args=[run_id])}?step={step}&traj={trajectory_id}"


def _ms(value) -> float | None:
    return round(float(value), 1) if value is not None else None


def run_reward_health(*, run: Run, step_from: int | None = None, step_to: int | None = None) -> dict:
    """The reward-health figures of a run, over the steps step_from..step_to (both included, None: open).

    {"step_from", "step_to", "trajectories", "reward_timed": trajectories the reward ran on,
     "errors": [{"stage", "type", "count", "example": {"trajectory", "step", "message", "link"}}],
     "latency": {"p50_ms", "p95_ms", "max_ms"},
     "per_step": [{"step", "trajectories", "reward_errors", "reward_error_share", "p50_ms", "p95_ms", "max_ms"}],
     "slowest": [{"trajectory", "step", "reward_ms", "reward", "error", "link"}]}

    reward_errors counts both the reward's own errors and its timeouts. Latencies are in milliseconds,
    over the trajectories the reward ran on (reward_ms set); None when there are none.
    """
    groups, steps, (timed, p50, p95, slowest_ms) = _aggregates(run, step_from, step_to)
    return {
        "step_from": step_from,
        "step_to": step_to,
        "trajectories": sum(s[1] for s in steps),
        "reward_timed": timed,
        "errors": _errors(run, groups),
        "latency": {"p50_ms": _ms(p50), "p95_ms": _ms(p95), "max_ms": _ms(slowest_ms)},
        "per_step": [
            {
                "step": step,
                "trajectories": n,
                "reward_errors": bad,
                "reward_error_share": bad / n,
                "p50_ms": _ms(s50),
                "p95_ms": _ms(s95),
                "max_ms": _ms(smax),
            }
            for step, n, bad, s50, s95, smax in steps
        ],
        "slowest": _slowest(run, step_from, step_to),
    }


def _aggregates(run: Run, step_from: int | None, step_to: int | None) -> tuple[list, list, tuple]:
    """Three aggregate queries: errors by (stage, type) with the first trajectory of each; per step the
    trajectories, reward errors and latency quantiles; and the whole range's latency (quantiles do not add
    up from the per-step ones)."""
    where, params = _where(run, step_from, step_to)
    table = Trajectory._meta.db_table
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT stage, kind, count(*), min(id) FROM ("
            f"  SELECT t.id, {_STAGE_SQL} AS stage, {_TYPE_SQL} AS kind FROM {table} t"
            f"  WHERE {where} AND t.error <> '') e GROUP BY stage, kind",
            [*_stage_params(), *_type_params(), *params],
        )
        groups = cur.fetchall()
        cur.execute(
            f"SELECT t.step, count(*), count(*) FILTER (WHERE ({_STAGE_SQL}) IN ('reward', 'timeout') "
            f"AND t.error <> ''), "
            f"percentile_cont(0.5) WITHIN GROUP (ORDER BY t.reward_ms), "
            f"percentile_cont(0.95) WITHIN GROUP (ORDER BY t.reward_ms), max(t.reward_ms) "
            f"FROM {table} t WHERE {where} GROUP BY t.step ORDER BY t.step",
            [*_stage_params(), *params],
        )
        steps = cur.fetchall()
        cur.execute(
            f"SELECT count(t.reward_ms), percentile_cont(0.5) WITHIN GROUP (ORDER BY t.reward_ms), "
            f"percentile_cont(0.95) WITHIN GROUP (ORDER BY t.reward_ms), max(t.reward_ms) "
            f"FROM {table} t WHERE {where}",
            params,
        )
        whole = cur.fetchone()
    return groups, steps, whole


def _errors(run: Run, groups: list) -> list[dict]:
    """Error groups in stage order, the most frequent first, each with its example trajectory."""
    examples = {t.id: t for t in Trajectory.objects.filter(id__in=[g[3] for g in groups]).only("id", "step", "error")}
    errors = []
    for stage, kind, count, example_id in sorted(groups, key=lambda g: (STAGES.index(g[0]), -g[2], g[1])):
        example = examples[example_id]
        errors.append(
            {
                "stage": stage,
                "type": kind,
                "count": count,
                "example": {
                    "trajectory": example.id,
                    "step": example.step,
                    "message": example.error[:2000],
                    "link": trajectory_link(run.id, example.step, example.id),
                },
            }
        )
    return errors


def _slowest(run: Run, step_from: int | None, step_to: int | None) -> list[dict]:
    return [
        {
            "trajectory": t.id,
            "step": t.step,
            "reward_ms": t.reward_ms,
            "reward": t.reward,
            "error": t.error[:300],
            "link": trajectory_link(run.id, t.step, t.id),
        }
        for t in Trajectory.objects.filter(run=run, reward_ms__isnull=False, **_step_filter(step_from, step_to))
        .order_by("-reward_ms", "id")
        .only("id", "step", "reward_ms", "reward", "error")[:SLOWEST_SHOWN]
    ]


def _step_filter(step_from: int | None, step_to: int | None) -> dict:
    out = {}
    if step_from is not None:
        out["step__gte"] = step_from
    if step_to is not None:
        out["step__lte"] = step_to
    return out
