"""The scenario × step heatmap page: which scenarios a run solves, from when, and which regress."""

from __future__ import annotations

from django import forms
from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.gzip import gzip_page

from artweb.errors import ApplicationError
from training.analytics.heatmap import MAX_STEP, heatmap_etag, heatmap_query, run_heatmap
from training.selectors import run_get
from training.views.plotly import plotly_url

SORTS = [("index", "Scenario index"), ("regressed", "Regressed most"), ("solved", "Solved first")]


class HeatmapFilterForm(forms.Form):
    split = forms.ChoiceField(
        required=False, choices=[("train", "Train"), ("validation", "Validation")], widget=forms.RadioSelect
    )
    # Query-string names "from" and "to", as in the API (declared below: "from" is a Python keyword).
    sort = forms.ChoiceField(required=False, choices=SORTS, label="Rows")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["from"] = forms.IntegerField(required=False, min_value=0, max_value=MAX_STEP, label="From step")
        self.fields["to"] = forms.IntegerField(required=False, min_value=0, max_value=MAX_STEP, label="To step")
        self.order_fields(["split", "from", "to", "sort"])


# The page is mostly the matrix's base64 text: gzip shrinks it about 3-fold (Django's gzip adds
# random padding against BREACH; the form reflects nothing secret).
@gzip_page
@login_required
def run_heatmap_view(request, run_id: int):
    run = run_get(user=request.user, run_id=run_id)
    form = HeatmapFilterForm(request.GET or None)
    heatmap = error = None
    if not form.is_bound or form.is_valid():
        f = form.cleaned_data if form.is_bound else {}
        try:
            query = heatmap_query(split=f.get("split") or "train", step_from=f.get("from"), step_to=f.get("to"))
        except ApplicationError as exc:
            error = exc.message
        else:
            heatmap = run_heatmap(run=run, query=query)
    page_data = None
    if heatmap is not None:
        page_data = {
            "heatmap": heatmap,
            "etag": heatmap_etag(query, heatmap["version"]),
            "sort": (form.cleaned_data.get("sort") if form.is_bound else "") or "index",
            "api_url": reverse("api-run-heatmap", args=[run.id]),
            "inspector_url": reverse("run-trajectories", args=[run.id]),
            "page_url": reverse("run-heatmap", args=[run.id]),
            "ws_path": f"/ws/runs/{run.id}/",
        }
    return render(
        request,
        "analytics/run_heatmap.html",
        {
            "nav": "runs",
            "run": run,
            "form": form,
            "error": error,
            "heatmap": heatmap,
            "page_data": page_data,
            "plotly_url": plotly_url(),
        },
    )
