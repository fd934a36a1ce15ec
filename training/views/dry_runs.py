"""Dry-run pages: the form (its own page, and a panel on the script, reward and scenario set pages), the
result and its status for polling."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET, require_http_methods

from artweb.errors import ApplicationError
from artweb.pages import apply_service_errors, panel_register
from artweb.presenters import history_transcripts, transcript
from rollouts import selectors as rollout_selectors
from training.forms import DryRunForm
from training.selectors import base_model_visible, dry_run_get
from training.services.dry_runs import dry_run_create, dry_run_waiting


def _dry_run_form(request, data=None, initial=None) -> DryRunForm:
    user = request.user
    return DryRunForm(
        data,
        initial=initial,
        script_versions=rollout_selectors.script_version_list(user=user),
        reward_versions=rollout_selectors.reward_version_list(user=user),
        base_models=base_model_visible(user),
        scenario_sets=rollout_selectors.scenario_set_list(user=user).order_by("name"),
        attachments=rollout_selectors.attachment_own_list(user=user),
    )


def dry_run_panel(request, *, initial=None) -> str:
    """The dry-run form as a panel of a rollouts page (registered in training.apps)."""
    form = _dry_run_form(request, initial=initial)
    return render_to_string("training/_dry_run_form.html", {"dry_run_form": form}, request=request)


def dry_run_panels_register() -> None:
    for page in ("asset-detail", "scenario-set-detail"):
        panel_register(page, dry_run_panel)


@login_required
@require_http_methods(["GET", "POST"])
def dry_run_create_view(request):
    if request.method == "GET":  # the form alone, prefilled from the link's query (the launch page's)
        form = _dry_run_form(request, initial=DryRunForm.prefill(request.GET))
        return render(request, "training/dry_run_form.html", {"nav": "scripts", "dry_run_form": form})
    form = _dry_run_form(request, request.POST)
    if form.is_valid():
        try:
            dry_run = dry_run_create(owner=request.user, **form.cleaned_data)
        except ApplicationError as exc:
            apply_service_errors(form, exc, DryRunForm.ERROR_ALIASES)
        else:
            return redirect("dry-run-detail", dry_run_id=dry_run.id)
    return render(request, "training/dry_run_form.html", {"nav": "scripts", "dry_run_form": form}, status=400)


def _dry_run_trajectories(result) -> list[dict]:
    """The result's trajectories with their transcripts (a list, or {"trajectories": [...]})."""
    items = result.get("trajectories", []) if isinstance(result, dict) else (result or [])
    out = []
    for i, t in enumerate(items):
        t = t if isinstance(t, dict) else {"messages": [], "error": str(t)}
        out.append(
            {
                "index": i,
                "reward": t.get("reward"),
                "error": t.get("error") or "",
                "scenario_index": t.get("scenario_index"),
                "logs": t.get("logs") or [],
                "metrics": t.get("metrics") or {},
                "scenario": t.get("scenario"),
                "turns": transcript(t.get("messages")),
                "histories": history_transcripts(t.get("additional_histories")),
            }
        )
    return out


@login_required
def dry_run_detail_view(request, dry_run_id: int):
    dry_run = dry_run_get(user=request.user, dry_run_id=dry_run_id)
    spread = dry_run.result.get("spread") if isinstance(dry_run.result, dict) else None
    return render(
        request,
        "training/dry_run_detail.html",
        {
            "nav": "scripts",
            "dry_run": dry_run,
            "trajectories": _dry_run_trajectories(dry_run.result),
            "spread": spread if isinstance(spread, dict) else None,
            "finished": dry_run.status in ("done", "failed"),
            "waiting": "" if dry_run.status in ("done", "failed") else dry_run_waiting(dry_run),
        },
    )


@login_required
@require_GET
def dry_run_status_view(request, dry_run_id: int):
    dry_run = dry_run_get(user=request.user, dry_run_id=dry_run_id)
    finished = dry_run.status in ("done", "failed")
    waiting = "" if finished else dry_run_waiting(dry_run)
    return JsonResponse({"id": dry_run.id, "status": dry_run.status, "finished": finished, "waiting": waiting})
