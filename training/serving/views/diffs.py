"""Answer diffs: two models over a scenario set's held-out split, scored, and what changed per scenario.
A diff queues a ServeJob (training.serving.services.serve_jobs) and its page follows it."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render

from artweb.errors import ApplicationError
from artweb.pages import apply_service_errors
from rollouts.selectors import reward_version_list, scenario_set_get
from training.serving import selectors
from training.serving.forms import DiffForm
from training.serving.models import ServeJob
from training.serving.services import serve_jobs as service


@login_required
def diff_list_view(request):
    user = request.user
    form = DiffForm(request.POST or None, user=user)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            job = service.diff_create(
                user=user,
                model_a=data["model_a"],
                model_b=data["model_b"],
                scenario_set=scenario_set_get(user=user, scenario_set_id=int(data["scenario_set"])),
                reward_version=reward_version_list(user=user).filter(id=data["reward"]).first(),
                samples=data["samples"],
                temperature=data["temperature"],
                max_tokens=data["max_tokens"],
                max_scenarios=data["max_scenarios"],
                system=data["system"],
                seed=data["seed"],
            )
        except ApplicationError as exc:
            apply_service_errors(form, exc, aliases={"models": "model_a", "reward_version": "reward"})
        else:
            messages.success(request, f"Answer diff #{job.id} queued; this page follows it.")
            return redirect("diff-detail", job_id=job.id)
    return render(
        request,
        "serving/diff_list.html",
        {"nav": "diffs", "form": form, "jobs": selectors.serve_job_list(user=user, kind=ServeJob.Kind.DIFF)[:100]},
    )


@login_required
def diff_detail_view(request, job_id: int):
    job = selectors.serve_job_get(user=request.user, job_id=job_id, kind=ServeJob.Kind.DIFF)
    rows = list(selectors.diff_scenarios(job=job).select_related("scenario")[:500])
    return render(request, "serving/diff_detail.html", {"nav": "diffs", "job": job, "rows": rows})
