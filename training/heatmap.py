"""The scenario × step heatmap of a run: one row per scenario, one column per step (or bin of steps),
each cell the mean reward of that scenario's groups there.

PostgreSQL does the aggregation; Python only packs the result. The matrix travels as base64 of one
byte per cell, row-major, which keeps 1,000 scenarios × 400 columns near 530 kB before gzip and a
fraction of it after (empty cells repeat one byte).

    value of a cell = min + q × (max − min) / 254   for its byte q < 255;   q = 255: no group there

The group counts (how many groups a cell averages) follow, one byte per non-empty cell in the same order.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import numpy as np
from django.db import connection

from artweb.errors import ApplicationError
from training.models import Run

# Columns a view shows at most; more steps than this are binned, consecutive steps per column.
MAX_COLUMNS = 400
# The byte of an empty cell, and the number of steps of the colour scale below it (0..254).
EMPTY = 255
LEVELS = 254
# Characters of a scenario's JSON shown when hovering its row.
SCENARIO_TEXT_CHARS = 100
SPLITS = ("train", "validation")
MAX_STEP = 2**31 - 1
# The most columns a client may ask for: 2,000 steps unbinned is the largest view worth drawing.
COLUMNS_LIMIT = 2000

# Failed attempts were never trained on (the README's "Failed steps keep what they produced"), and a
# group without a finite mean (every rollout errored) has no reward to show: neither makes a cell.
_GROUPS = """
    FROM rollouts_trajectorygroup g
    WHERE g.run_id = %(run)s AND g.split = %(split)s AND NOT g.failed_attempt
      AND g.step BETWEEN %(lo)s AND %(hi)s
      AND g.reward_mean IS NOT NULL AND g.reward_mean NOT IN ('NaN', 'Infinity', '-Infinity')
"""

# What the cells of every view of a run depend on, besides the rows' values: the newest group (new groups)
# and the failed attempts (a failed step marks its groups). Groups are otherwise never edited.
_VERSION = """
    SELECT ARRAY[coalesce(max(id), 0), count(*) FILTER (WHERE failed_attempt)]
    FROM rollouts_trajectorygroup WHERE run_id = %(run)s
"""

# One statement, hence one snapshot: the cells and the cursor (the run's newest group id, whatever
# its split) agree, so a live page counts every group exactly once: those up to the cursor are in
# the cells, the socket brings the rest. The aggregates of one query read its rows in one order, so
# the arrays line up; numpy sorts them (cheaper than an ORDER BY per array here).
_CELLS = f"""
    WITH cells AS (
        SELECT g.scenario_id, width_bucket(g.step, %(starts)s::int[]) - 1 AS col,
               avg(g.reward_mean) AS mean, count(*) AS n
        {_GROUPS}
        GROUP BY 1, 2
    )
    SELECT coalesce(array_agg(s.index), '{{}}'), coalesce(array_agg(c.scenario_id), '{{}}'),
           coalesce(array_agg(c.col), '{{}}'), coalesce(array_agg(c.mean), '{{}}'), coalesce(array_agg(c.n), '{{}}'),
           ({_VERSION})
    FROM cells c JOIN rollouts_scenario s ON s.id = c.scenario_id
"""


@dataclass(frozen=True)
class HeatmapQuery:
    """What a view asks for: a split and, to zoom in, a step range (both ends included)."""

    split: str = "train"
    step_from: int | None = None
    step_to: int | None = None
    max_columns: int = MAX_COLUMNS


def heatmap_query(
    *, split: str = "train", step_from: int | None = None, step_to: int | None = None, max_columns: int = MAX_COLUMNS
) -> HeatmapQuery:
    """A checked HeatmapQuery; ApplicationError naming the field and what to change otherwise."""
    if split not in SPLITS:
        raise ApplicationError(
            f"Unknown split {split!r}: choose train or validation.",
            field_errors={"split": [f"one of {', '.join(SPLITS)}"]},
        )
    for name, value in (("from", step_from), ("to", step_to)):
        if value is not None and not 0 <= value <= MAX_STEP:
            raise ApplicationError(
                f"The step '{name}' must be between 0 and {MAX_STEP}.",
                field_errors={name: [f"between 0 and {MAX_STEP}"]},
            )
    if step_from is not None and step_to is not None and step_from > step_to:
        raise ApplicationError(
            f"The step range is empty: 'from' ({step_from}) is after 'to' ({step_to}). Swap them, or leave one out.",
            field_errors={"to": [f"at least {step_from} (the 'from' step)"]},
        )
    if not 1 <= max_columns <= COLUMNS_LIMIT:
        raise ApplicationError(
            f"max_columns must be between 1 and {COLUMNS_LIMIT}.",
            field_errors={"max_columns": [f"between 1 and {COLUMNS_LIMIT}"]},
        )
    return HeatmapQuery(split=split, step_from=step_from, step_to=step_to, max_columns=max_columns)


def heatmap_etag(query: HeatmapQuery, version: str) -> str:
    """An HTTP entity tag naming one view of one state of a run's groups."""
    return f'"{query.split}-{query.step_from}-{query.step_to}-{query.max_columns}-{version}"'


def _b64(array: np.ndarray) -> str:
    return base64.b64encode(array.astype(np.uint8).tobytes()).decode("ascii")


def _column_bins(steps: list[int], max_columns: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(first step, last step) of each column, and the most steps a column holds: every step its own
    column, or, past max_columns, the steps cut into max_columns runs of consecutive steps whose
    lengths differ by one at most."""
    s = np.asarray(steps, dtype=np.int64)
    n = len(s)
    if n == 0:
        return s, s, 1
    m = min(n, max_columns)
    first = (np.arange(m) * n) // m  # index in s of each column's first step
    last = np.append(first[1:], n) - 1
    return s[first], s[last], int((last - first).max()) + 1


def run_heatmap(*, run: Run, query: HeatmapQuery) -> dict:
    """The matrix of a run's split, as the page, its socket updates and the API use it.

    Rows are the scenarios that have a group in the view, by scenario index; columns the steps that
    have one (a validation view has a column per validation step). Empty cells are empty, not zero.
    """
    lo = query.step_from if query.step_from is not None else 0
    hi = query.step_to if query.step_to is not None else 2**31 - 1
    params = {"run": run.id, "split": query.split, "lo": lo, "hi": hi}
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT DISTINCT g.step {_GROUPS} ORDER BY 1", params)
        steps = [r[0] for r in cursor.fetchall()]
        starts, ends, per_column = _column_bins(steps, query.max_columns)
        cursor.execute(_CELLS, {**params, "starts": starts.tolist()})
        indexes, scenario_ids, cols, means, counts, (last_group, failed) = cursor.fetchone()

    # Cells by scenario index, then column (row-major); rows are the distinct scenarios, by index.
    col_arr = np.asarray(cols, dtype=np.int64)
    index_arr = np.asarray(indexes, dtype=np.int64)
    by_cell = np.lexsort((col_arr, index_arr))
    col_arr, index_arr = col_arr[by_cell], index_arr[by_cell]
    new_row = np.ones(len(index_arr), dtype=bool)
    new_row[1:] = index_arr[1:] != index_arr[:-1]
    row_of_cell = np.cumsum(new_row) - 1
    row_ids = np.asarray(scenario_ids, dtype=np.int64)[by_cell][new_row].tolist()
    texts = _scenario_texts(row_ids)

    n_rows, n_cols = len(row_ids), len(starts)
    mean_arr = np.asarray(means, dtype=np.float64)[by_cell]
    vmin = float(mean_arr.min()) if len(mean_arr) else 0.0
    vmax = float(mean_arr.max()) if len(mean_arr) else 0.0
    scale = LEVELS / (vmax - vmin) if vmax > vmin else 0.0
    values = np.full((n_rows, n_cols), EMPTY, dtype=np.uint8)
    values[row_of_cell, col_arr] = np.rint((mean_arr - vmin) * scale).astype(np.uint8)
    # Counts only of the non-empty cells, in the same row-major order: most cells are empty.
    group_counts = np.minimum(np.asarray(counts, dtype=np.int64)[by_cell], 255)

    return {
        "run": run.id,
        "split": query.split,
        "step_from": query.step_from,
        "step_to": query.step_to,
        "steps": len(steps),
        "binned": len(steps) > n_cols,
        "columns": {"first_step": starts.tolist(), "last_step": ends.tolist()},
        "steps_per_column": per_column,
        "rows": {
            "scenario": row_ids,
            "index": index_arr[new_row].tolist(),
            "text": [texts.get(i, "") for i in row_ids],
        },
        "values": {"min": vmin, "max": vmax, "levels": LEVELS, "empty": EMPTY, "data": _b64(values)},
        "counts": {"data": _b64(group_counts)},
        "last_group": last_group,
        "version": f"{last_group}.{failed}",
    }


def run_heatmap_version(*, run: Run) -> str:
    """The payload's `version` without computing the payload: a client holding it has the current cells."""
    with connection.cursor() as cursor:
        cursor.execute(_VERSION, {"run": run.id})
        last_group, failed = cursor.fetchone()[0]
    return f"{last_group}.{failed}"


def _scenario_texts(scenario_ids: list[int]) -> dict[int, str]:
    """The beginning of each scenario's JSON, cut in PostgreSQL (a scenario may be large)."""
    if not scenario_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, left(data::text, %s) FROM rollouts_scenario WHERE id = ANY(%s)",
            [SCENARIO_TEXT_CHARS, scenario_ids],
        )
        return dict(cursor.fetchall())


def heatmap_decode(payload: dict) -> tuple[np.ndarray, np.ndarray]:
    """(values with NaN where empty, group counts), rows × columns: what a client does with the payload."""
    shape = (len(payload["rows"]["scenario"]), len(payload["columns"]["first_step"]))
    q = np.frombuffer(base64.b64decode(payload["values"]["data"]), dtype=np.uint8).reshape(shape)
    v = payload["values"]
    values = v["min"] + q.astype(np.float64) * (v["max"] - v["min"]) / v["levels"]
    values[q == v["empty"]] = np.nan
    counts = np.zeros(shape, dtype=np.uint8)
    counts[q != v["empty"]] = np.frombuffer(base64.b64decode(payload["counts"]["data"]), dtype=np.uint8)
    return values, counts
