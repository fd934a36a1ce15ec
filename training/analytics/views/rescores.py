"""Re-scoring pages: a run's re-scores with the form that starts one, and one re-score's agreement."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.urls import reverse

from artweb.errors import ApplicationError
from artweb.pages import apply_service_errors
from rollouts.selectors import reward_version_list
from training.analytics import rescores as service
from training.models import RescoreScore
from training.selectors import judge_endpoint_list, run_get
from training.views.plotly import plotly_url

SCORES_PER_PAGE = 100
SCATTER_POINTS = 5000  # the scatter's points, the largest disagreements first
ORDER_LABELS = {
    "disagreement": "Disagreements first",
    "step": "By step",
    "new_reward": "New reward, highest first",
    "old_reward": "Old reward, highest first",
    "errors": "Errors first",
}


class RescoreForm(forms.Form):
    """What scores the trajectories again: one of the person's reward function versions, or RULER with one
    of their judge endpoints ("v:<id>" or "ruler:<endpoint name>")."""

    scorer = forms.ChoiceField(label="Score with")
    split = forms.ChoiceField(
        choices=[("train", "Training trajectories"), ("validation", "Validation trajectories")],
        initial="train",
        label="Trajectories",
    )

    def __init__(self, *args, versions, endpoints, **kwargs):
        super().__init__(*args, **kwargs)
        self.versions = {str(v.id): v for v in versions}
        choices = [(f"v:{v.id}", f"{v.asset.name} v{v.number}") for v in versions]
        choices += [(f"ruler:{e.name}", f"RULER, judged by {e.name} ({e.model})") for e in endpoints]
        self.fields["scorer"].choices = choices

    def service_kwargs(self) -> dict:
        kind, _, value = self.cleaned_data["scorer"].partition(":")
        if kind == "v":
            return {"reward_version": self.versions[value], "split": self.cleaned_data["split"]}
        return {"use_ruler": True, "ruler_judge": f"endpoint:{value}", "split": self.cleaned_data["split"]}


@login_required
def run_rescores_view(request, run_id: int):
    run = run_get(user=request.user, run_id=run_id)
    form = RescoreForm(
        request.POST or None,
        versions=list(reward_version_list(user=request.user)),
        endpoints=list(judge_endpoint_list(owner=run.owner)),
        initial={"scorer": f"v:{run.reward_version_id}" if run.reward_version_id else None},
    )
    if request.method == "POST" and form.is_valid():
        try:
            rescore = service.rescore_create(user=request.user, run=run, **form.service_kwargs())
        except ApplicationError as exc:
            apply_service_errors(form, exc, aliases={"reward_version": "scorer", "ruler_judge": "scorer"})
        else:
            messages.success(request, f"Re-score #{rescore.id} queued; this page follows its progress.")
            return redirect("rescore-detail", rescore_id=rescore.id)
    return render(
        request,
        "analytics/rescore_list.html",
        {
            "nav": "runs",
            "run": run,
            "form": form,
            "rescores": service.rescore_list(user=request.user, run=run),
        },
    )


@login_required
def rescore_detail_view(request, rescore_id: int):
    rescore = service.rescore_get(user=request.user, rescore_id=rescore_id)
    ordering = request.GET.get("ordering") if request.GET.get("ordering") in service.ORDERINGS else "disagreement"
    scores = service.rescore_scores(rescore=rescore, ordering=ordering).defer("metrics")
    page = Paginator(scores, SCORES_PER_PAGE).get_page(request.GET.get("page"))
    scatter = list(
        service.rescore_scores(rescore=rescore)
        .filter(old_reward__isnull=False, new_reward__isnull=False)
        .values_list("old_reward", "new_reward", "trajectory_id", "step")[:SCATTER_POINTS]
    )
    summary = rescore.summary or {}
    inspector = reverse("run-trajectories", args=[rescore.run_id])
    return render(
        request,
        "analytics/rescore_detail.html",
        {
            "nav": "runs",
            "rescore": rescore,
            "run": rescore.run,
            "label": service.rescore_label(rescore),
            "summary": summary,
            "page": page,
            "ordering": ordering,
            "order_labels": ORDER_LABELS,
            "inspector": inspector,
            "rows": _rows(page.object_list, inspector, rescore.split),
            "plotly_url": plotly_url(),
            "page_data": {
                "rescore": rescore.id,
                "status": rescore.status,
                "api": f"/api/v1/rescores/{rescore.id}/",
                "done": rescore.trajectories_done,
                "total": rescore.trajectories_total,
                "curve": summary.get("curve"),
                "scatter": {
                    "old": [s[0] for s in scatter],
                    "new": [s[1] for s in scatter],
                    "trajectory": [s[2] for s in scatter],
                    "step": [s[3] for s in scatter],
                },
                "inspector": inspector,
                "split": rescore.split,
            },
        },
    )


def _rows(scores: list[RescoreScore], inspector: str, split: str) -> list[dict]:
    return [
        {
            "score": s,
            "link": f"{inspector}?step={s.step}&split={split}&traj={s.trajectory_id}",
            "diff": None if s.old_reward is None or s.new_reward is None else s.new_reward - s.old_reward,
        }
        for s in scores
    ]
