"""A run's reward-health page: reward errors by kind, reward latency, the slowest trajectories."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.urls import reverse

from training.analytics.reward_health import run_reward_health
from training.selectors import run_get
from training.views.plotly import plotly_url


@login_required
def run_reward_health_view(request, run_id: int):
    run = run_get(user=request.user, run_id=run_id)
    return render(
        request,
        "analytics/run_health.html",
        {
            "nav": "runs",
            "run": run,
            # The page's script draws everything from this (the API's answer, same shape) and refetches it
            # when the run's socket says a step or a group was written.
            "page_data": {
                "health": run_reward_health(run=run),
                "api_url": reverse("api-run-reward-health", args=[run.id]),
                "ws_path": f"/ws/runs/{run.id}/",
            },
            "plotly_url": plotly_url(),
        },
    )
