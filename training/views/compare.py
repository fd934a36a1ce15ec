"""Compare runs: their curves overlaid, and only the settings that differ."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from artweb.presenters import config_differences
from training.charts import DEFAULT_SERIES, RUN_CHARTS
from training.selectors import CLIENT_TASK, run_list, run_metrics, run_visible
from training.views.plotly import plotly_url

MAX_RUNS = 8
CHART_POINTS = 500


def _comparable(run) -> dict:
    """A run's config plus what it was built from, so those differences show too (a client-driven run's
    rollouts are its ART client's: no script)."""
    reward, script = run.reward_version, run.script_version
    return {
        "base_model": run.base_model.name,
        "script": f"{script.asset.name} v{script.number}" if script else CLIENT_TASK,
        "reward": f"{reward.asset.name} v{reward.number}" if reward else "",
        "scenario_set": run.scenario_set.name,
        **(run.config or {}),
    }


@login_required
def run_compare_view(request):
    ids = [int(i) for i in request.GET.getlist("runs") if i.isdigit()][:MAX_RUNS]
    runs = list(
        run_visible(request.user)
        .filter(id__in=ids)
        .select_related("base_model", "scenario_set", "script_version__asset", "reward_version__asset")
        .order_by("id")
    )
    chart = [
        {"id": r.id, "name": r.name, "series": run_metrics(run=r, max_points=CHART_POINTS)["series"]} for r in runs
    ]
    return render(
        request,
        "training/run_compare.html",
        {
            "nav": "compare",
            "runs": runs,
            "selected": {r.id for r in runs},
            "choices": run_list(user=request.user)[:100],
            "differences": config_differences([_comparable(r) for r in runs]) if len(runs) > 1 else [],
            "chart_data": {"runs": chart, "series": list(DEFAULT_SERIES), "charts": RUN_CHARTS},
            "plotly_url": plotly_url(),
        },
    )
