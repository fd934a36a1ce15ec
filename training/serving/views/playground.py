"""The playground: one prompt (or a scenario) answered by up to four models side by side. A session queues a
ServeJob (training.serving.services.serve_jobs) and the page shows it when done."""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render

from artweb.errors import ApplicationError
from artweb.pages import apply_service_errors
from rollouts.selectors import reward_version_list, scenario_list
from training.serving import selectors
from training.serving.forms import PlaygroundForm
from training.serving.models import ServeJob
from training.serving.services import serve_jobs as service


@login_required
def playground_view(request, job_id: int | None = None):
    user = request.user
    job = selectors.serve_job_get(user=user, job_id=job_id, kind=ServeJob.Kind.PLAYGROUND) if job_id else None
    initial = {}
    if job is not None:
        p = job.params
        initial = {
            "prompt": p.get("prompt", ""),
            "system": p.get("system", ""),
            "scenario": str(p["scenario"]) if p.get("scenario") else "",
            "samples": p.get("samples"),
            "temperature": p.get("temperature"),
            "max_tokens": p.get("max_tokens"),
            "reward": str(job.reward_version_id or ""),
            "tools": (p["tools"] if isinstance(p["tools"], str) else json.dumps(p["tools"])) if p.get("tools") else "",
            "tool_choice": p.get("tool_choice", "auto"),
            **{f"model_{k + 1}": name for k, name in enumerate(job.model_names)},
        }
    form = PlaygroundForm(request.POST or None, user=user, initial=initial)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            new = service.playground_create(
                user=user,
                models=[data[f"model_{k}"] for k in (1, 2, 3, 4) if data.get(f"model_{k}")],
                prompt=data["prompt"],
                system=data["system"],
                scenario=scenario_list(user=user).filter(id=data["scenario"]).first() if data["scenario"] else None,
                tools=data["tools"],
                tool_choice=data["tool_choice"],
                reward_version=reward_version_list(user=user).filter(id=data["reward"]).first()
                if data["reward"]
                else None,
                samples=data["samples"],
                temperature=data["temperature"],
                max_tokens=data["max_tokens"],
            )
        except ApplicationError as exc:
            apply_service_errors(form, exc, aliases={"models": "model_1", "reward_version": "reward"})
        else:
            return redirect("playground-session", job_id=new.id)
    return render(
        request,
        "serving/playground.html",
        {"nav": "playground", "form": form, "job": job, "result": job.result if job else None},
    )
