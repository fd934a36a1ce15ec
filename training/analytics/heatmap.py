"""The scenario × step heatmap of a run: one row per scenario, one column per step (or bin of steps),
each cell the mean reward of that scenario's groups there.

Each committed step stores its cells once (HeatmapColumn, written in the step's commit); a view reads
those columns and only averages the groups of steps not committed yet, then bins columns with numpy. The matrix travels as base64 of one
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

from artweb.api import MAX_INT
from artweb.errors import ApplicationError
from training.models import HeatmapColumn, Run

# Columns a view shows at most; more steps than this are binned, consecutive steps per column.
MAX_COLUMNS = 400
# The byte of an empty cell, and the number of steps of the colour scale below it (0..254).
EMPTY = 255
LEVELS = 254
# Characters of a scenario's JSON shown when hovering its row.
SCENARIO_TEXT_CHARS = 100
SPLITS = ("train", "validation")
MAX_STEP = MAX_INT  # a step number is a PostgreSQL integer
# The most columns a client may ask for: 2,000 steps unbinned is the largest view worth drawing.
COLUMNS_LIMIT = 2000

# Failed attempts were never trained on (docs/concepts/runs.md, "When something fails"), and a
# group without a finite mean (every rollout errored) has no reward to show: neither makes a cell.
_FINITE = """
    NOT g.failed_attempt AND g.reward_mean IS NOT NULL AND g.reward_mean NOT IN ('NaN', 'Infinity', '-Infinity')
"""

# One scenario's cell of one step, as HeatmapColumn.cells packs it (little-endian, 16 bytes).
CELL = np.dtype([("scenario", "<i4"), ("n", "<i4"), ("sum", "<f8")])

# What the cells of every view of a run depend on, besides the rows' values: the newest group (new groups)
# and the failed attempts (a failed step marks its groups). Groups are otherwise never edited.
_VERSION = """
    SELECT ARRAY[coalesce(max(id), 0), count(*) FILTER (WHERE failed_attempt)]
    FROM rollouts_trajectorygroup WHERE run_id = %(run)s
"""

# One statement, hence one snapshot: the committed steps' columns, the groups of steps after the last
# committed one (the step in progress, or a run from before columns were kept), and the cursor (the
# run's newest group id, whatever its split) all agree, so a live page counts every group exactly
# once: those up to the cursor are in the cells, the socket brings the rest.
_CELLS = f"""
    WITH settled AS (
        SELECT step, cells FROM training_heatmapcolumn
        WHERE run_id = %(run)s AND split = %(split)s AND step BETWEEN %(lo)s AND %(hi)s
    ), tail AS (
        SELECT g.scenario_id, g.step, count(*) AS n, sum(g.reward_mean) AS total
        FROM rollouts_trajectorygroup g
        WHERE g.run_id = %(run)s AND g.split = %(split)s AND g.step BETWEEN %(lo)s AND %(hi)s AND {_FINITE}
          AND g.step > (SELECT coalesce(max(step), -1) FROM training_heatmapcolumn
                        WHERE run_id = %(run)s AND split = %(split)s)
        GROUP BY 1, 2
    )
    SELECT (SELECT coalesce(array_agg(step ORDER BY step), '{{}}') FROM settled),
           (SELECT coalesce(array_agg(length(cells) / {CELL.itemsize} ORDER BY step), '{{}}') FROM settled),
           (SELECT coalesce(string_agg(cells, ''::bytea ORDER BY step), ''::bytea) FROM settled),
           coalesce(array_agg(t.scenario_id), '{{}}'), coalesce(array_agg(t.step), '{{}}'),
           coalesce(array_agg(t.n), '{{}}'), coalesce(array_agg(t.total), '{{}}'),
           ({_VERSION})
    FROM tail t
"""

# A step's cells, both splits, from its groups: what its HeatmapColumn rows hold.
_STEP_CELLS = f"""
    SELECT g.split, g.scenario_id, count(*), sum(g.reward_mean)
    FROM rollouts_trajectorygroup g
    WHERE g.run_id = %(run)s AND g.step = %(step)s AND {_FINITE}
    GROUP BY 1, 2 ORDER BY 1, 2
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


def heatmap_columns_record(*, run_id: int, step: int) -> None:
    """Store a step's heatmap columns (train and validation) from its groups. Called inside the step's
    commit, once its groups are final; writing them again (a repeated commit) replaces them."""
    with connection.cursor() as cursor:
        cursor.execute(_STEP_CELLS, {"run": run_id, "step": step})
        rows = cursor.fetchall()
    by_split: dict[str, list[tuple]] = {}
    for split, scenario_id, n, total in rows:
        by_split.setdefault(split, []).append((scenario_id, n, total))
    HeatmapColumn.objects.bulk_create(
        [
            HeatmapColumn(run_id=run_id, split=split, step=step, cells=np.array(cells, dtype=CELL).tobytes())
            for split, cells in by_split.items()
        ],
        update_conflicts=True,
        unique_fields=["run", "split", "step"],
        update_fields=["cells"],
    )


def run_heatmap(*, run: Run, query: HeatmapQuery) -> dict:
    """The matrix of a run's split, as the page, its socket updates and the API use it.

    Rows are the scenarios that have a group in the view, by scenario index; columns the steps that
    have one (a validation view has a column per validation step). Empty cells are empty, not zero.
    """
    lo = query.step_from if query.step_from is not None else 0
    hi = query.step_to if query.step_to is not None else MAX_STEP
    params = {"run": run.id, "split": query.split, "lo": lo, "hi": hi}
    with connection.cursor() as cursor:
        cursor.execute(_CELLS, params)
        settled_steps, settled_sizes, packed, t_scenarios, t_steps, t_counts, t_totals, (last_group, failed) = (
            cursor.fetchone()
        )

    # Every (scenario, step) cell of the view: the committed steps' columns, then the tail's groups.
    # Up to 2,000,000 of them (every scenario at every step): nothing below sorts them.
    settled = np.frombuffer(bytes(packed), dtype=CELL)
    settled_steps = np.asarray(settled_steps, dtype=np.int64)
    settled_sizes = np.asarray(settled_sizes, dtype=np.int64)
    t_steps = np.asarray(t_steps, dtype=np.int64)
    steps = np.union1d(settled_steps[settled_sizes > 0], t_steps)
    starts, ends, per_column = _column_bins(steps.tolist(), query.max_columns)

    def column(of_steps: np.ndarray) -> np.ndarray:
        return np.searchsorted(starts, of_steps, side="right") - 1

    col = np.concatenate([np.repeat(column(settled_steps), settled_sizes), column(t_steps)])
    scenario = np.concatenate([settled["scenario"].astype(np.int64), np.asarray(t_scenarios, dtype=np.int64)])
    count = np.concatenate([settled["n"].astype(np.int64), np.asarray(t_counts, dtype=np.int64)])
    total = np.concatenate([settled["sum"], np.asarray(t_totals, dtype=np.float64)])

    # Rows: the distinct scenarios, by scenario index.
    ids, of_cell = _distinct(scenario)
    info = _scenario_rows(ids.tolist())
    by_index = sorted(range(len(ids)), key=lambda k: info[int(ids[k])][0])
    row_ids = [int(ids[k]) for k in by_index]
    rank = np.empty(len(ids), dtype=np.int64)
    rank[by_index] = np.arange(len(ids))
    row = rank[of_cell]

    n_rows, n_cols = len(row_ids), len(starts)
    flat = row * n_cols + col
    sums = np.bincount(flat, weights=total, minlength=n_rows * n_cols)
    groups = np.bincount(flat, weights=count, minlength=n_rows * n_cols).astype(np.int64)
    filled = groups > 0
    means = sums[filled] / groups[filled]  # row-major: cells by scenario index, then column
    vmin = float(means.min()) if len(means) else 0.0
    vmax = float(means.max()) if len(means) else 0.0
    scale = LEVELS / (vmax - vmin) if vmax > vmin else 0.0
    values = np.full(n_rows * n_cols, EMPTY, dtype=np.uint8)
    values[filled] = np.rint((means - vmin) * scale).astype(np.uint8)
    # Counts only of the non-empty cells, in the same row-major order: most cells are empty.
    group_counts = np.minimum(groups[filled], 255)

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
            "index": [info[i][0] for i in row_ids],
            "text": [info[i][1] for i in row_ids],
        },
        "values": {"min": vmin, "max": vmax, "levels": LEVELS, "empty": EMPTY, "data": _b64(values)},
        "counts": {"data": _b64(group_counts)},
        "last_group": last_group,
        "version": f"{last_group}.{failed}",
    }


def _distinct(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct ids, ascending; the position of each id among them). A scenario set's ids are
    almost always one dense range (its scenarios are created together): a table over the range then
    does it without sorting millions of cells; a scattered set falls back to numpy's sort."""
    if not len(ids):
        return ids, ids
    first, span = int(ids.min()), int(ids.max()) - int(ids.min()) + 1
    if span > 4 * len(ids) + 4096:
        return np.unique(ids, return_inverse=True)
    present = np.zeros(span, dtype=bool)
    present[ids - first] = True
    return np.flatnonzero(present) + first, (np.cumsum(present) - 1)[ids - first]


def run_heatmap_version(*, run: Run) -> str:
    """The payload's `version` without computing the payload: a client holding it has the current cells."""
    with connection.cursor() as cursor:
        cursor.execute(_VERSION, {"run": run.id})
        last_group, failed = cursor.fetchone()[0]
    return f"{last_group}.{failed}"


def _scenario_rows(scenario_ids: list[int]) -> dict[int, tuple[int, str]]:
    """Each scenario's (index, beginning of its JSON), the text cut in PostgreSQL (a scenario may be large)."""
    if not scenario_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, index, left(data::text, %s) FROM rollouts_scenario WHERE id = ANY(%s)",
            [SCENARIO_TEXT_CHARS, scenario_ids],
        )
        return {scenario_id: (index, text) for scenario_id, index, text in cursor.fetchall()}


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
