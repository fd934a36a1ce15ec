"""Runs: the list, one run's page, its action buttons, the launch form and checkpoint downloads."""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import FileResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from artweb.errors import ApplicationError
from artweb.pages import apply_service_errors
from rollouts.selectors import attachment_own_list, reward_version_list, scenario_set_list, script_version_list
from training import services
from training.analytics.alerts import run_alert_rules_update
from training.charts import RUN_CHARTS
from training.forms import (
    AlertRulesForm,
    RunFilterForm,
    RunLaunchForm,
    learning_rate_used,
    train_config_reference,
)
from training.models import Run
from training.selectors import (
    CLIENT_TASK,
    GROUPS_SHOWN,
    base_model_visible,
    checkpoint_list,
    quota_status,
    run_chart_data,
    run_client_summary,
    run_events_recent,
    run_get,
    run_latest_id,
    run_list,
    run_logs_recent,
    run_warnings,
)
from training.selectors_queue import run_queue_place, run_queue_places
from training.services.broadcast import checkpoint_message, run_group_messages, run_row_message, run_summary
from training.services.checkpoints import checkpoint_archive
from training.views.plotly import plotly_url

PAGE_SIZES = (25, 50, 100, 200)
CHART_POINTS = 500


@login_required
def run_list_view(request):
    # Read before the page's runs: a run created in between is then both listed and caught up (once).
    last_run = run_latest_id(user=request.user)
    models_qs = base_model_visible(request.user)
    form = RunFilterForm(request.GET or None, base_models=models_qs)
    runs = run_list(user=request.user, **form.selector_kwargs())
    per_page = int(request.GET["per_page"]) if request.GET.get("per_page", "").isdigit() else 50
    per_page = per_page if per_page in PAGE_SIZES else 50
    page = Paginator(runs, per_page).get_page(request.GET.get("page"))
    # Each row as the live list receives it (training.services.broadcast.run_row_message): one builder.
    rows = [run_row_message(run) for run in page.object_list]
    # Each row's place in the fair queue while its run waits for a GPU worker (run_queue_places: one read).
    places = run_queue_places() if any(row["status"] in Run.ACTIVE_STATUSES for row in rows) else {}
    query = request.GET.copy()
    query.pop("page", None)
    filters = form.selector_kwargs()
    return render(
        request,
        "training/run_list.html",
        {
            "nav": "runs",
            "form": form,
            "page": page,
            "rows": rows,
            "placed_rows": [(row, places.get(row["run"])) for row in rows],
            "query": query.urlencode(),
            "per_page": per_page,
            "page_sizes": PAGE_SIZES,
            # The live list's cursor, and whether a new run belongs at the top of this page: the newest
            # first, unfiltered, page 1. Elsewhere the page says a run is new and links to where it is.
            "last_run": last_run,
            "inserts_new": page.number == 1 and filters.pop("order") == "-created_at" and not any(filters.values()),
            "quotas": quota_status(user=request.user),
            "client_task": CLIENT_TASK,
        },
    )


def _run_page_data(run, chart, events, logs, groups, actions, summary, as_of) -> dict:
    """What the run page's script starts from; the socket brings everything after it (a status message
    brings the actions the new status allows). summary: the figures the page shows besides its charts
    (training.services.broadcast.run_summary, the builder of the live ones too); as_of: when the page
    read its checkpoints, the catch-up's cursor for them."""
    return {
        "run": run.id,
        "actions": actions,
        "summary": summary,
        "charts": RUN_CHARTS,
        "series": chart["series"],
        "last_step": chart["last_step"],
        "last_event": events[-1].id if events else 0,
        "last_log": logs[-1].id if logs else 0,
        "groups": groups,
        "groups_shown": GROUPS_SHOWN,
        "checkpoints_since": as_of.isoformat(),
        "ws_path": f"/ws/runs/{run.id}/",
    }


@login_required
def run_detail_view(request, run_id: int):
    run = run_get(user=request.user, run_id=run_id)
    as_of = timezone.now()  # before the reads: a checkpoint written meanwhile comes again on catch-up
    chart = run_chart_data(run=run, max_points=CHART_POINTS)
    events = run_events_recent(run=run, limit=50)
    logs = run_logs_recent(run=run, limit=100)
    groups = run_group_messages(run_id=run.id)
    actions = services.run_actions(run=run, user=request.user)
    checkpoints = [checkpoint_message(c) for c in checkpoint_list(run=run)]
    summary = run_summary(run, checkpoints=len(checkpoints))
    queue = run_queue_place(run=run)
    return render(
        request,
        "training/run_detail.html",
        {
            "nav": "runs",
            "run": run,
            "actions": actions,
            "summary": summary,
            "page_data": _run_page_data(run, chart, events, logs, groups, actions, summary, as_of),
            "queue": queue,  # its place in the fair queue while it waits for a GPU worker; the socket moves it
            "charts": RUN_CHARTS,
            "events": events,
            "warnings": run_warnings(run=run),
            "logs": logs,
            "checkpoints": checkpoints,
            # A client-driven run: where its rollouts run, its client's last call, its training jobs.
            "client": run_client_summary(run=run),
            "config_json": json.dumps(run.config, indent=2, sort_keys=True),
            "alerts_form": AlertRulesForm(rules=run.config.get("alerts", {})),
            "plotly_url": plotly_url(),
            "admin_checkpoints_url": reverse("admin:index") + f"training/checkpoint/?run__id__exact={run.id}",
            "admin_client_jobs_url": reverse("admin:index") + f"client_runs/clienttrainingjob/?run__id__exact={run.id}",
        },
    )


RUN_ACTIONS = {
    "cancel": (services.run_cancel, "Cancel requested."),
    "pause": (services.run_pause, "Pause requested."),
    "resume": (services.run_resume, "Run resumed; it is queued again."),
    "retry": (services.run_retry, "Run queued again; it continues from its last checkpoint."),
}


@login_required
@require_POST
def run_action_view(request, run_id: int, action: str):
    run = run_get(user=request.user, run_id=run_id)
    service, done = RUN_ACTIONS.get(action, (None, None))
    if service is None:
        messages.error(request, f"Unknown action {action!r}.")
    else:
        try:
            service(run=run, actor=request.user)
            messages.success(request, done)
        except ApplicationError as exc:
            messages.error(request, exc.message)
    return redirect("run-detail", run_id=run.id)


@login_required
@require_POST
def run_alerts_view(request, run_id: int):
    """Save the run's alert rules from the Config tab; they apply from the next step on."""
    run = run_get(user=request.user, run_id=run_id)
    form = AlertRulesForm(request.POST, rules=run.config.get("alerts", {}))
    if not form.is_valid():
        problems = "; ".join(f"{name}: {errs[0]}" for name, errs in form.errors.items())
        messages.error(request, f"Alert rules not saved: {problems}")
    else:
        try:
            run_alert_rules_update(run=run, changes=form.changes(), actor=request.user)
            messages.success(request, "Alert rules saved; they apply from the next step on.")
        except ApplicationError as exc:
            messages.error(request, f"Alert rules not saved: {exc.message}")
    return redirect(reverse("run-detail", args=[run.id]) + "#config")


def _launch_form(request, data=None, initial=None) -> RunLaunchForm:
    user = request.user
    return RunLaunchForm(
        data,
        initial=initial,
        base_models=base_model_visible(user),
        script_versions=script_version_list(user=user),
        reward_versions=reward_version_list(user=user),
        scenario_sets=scenario_set_list(user=user).order_by("name"),
        attachments=attachment_own_list(user=user),
    )


def _launch_hints(form: RunLaunchForm) -> dict:
    """What the launch page's script reads: each script version's companion reward version (the newest
    version of the reward function written for that script) and each base model's recommended settings."""
    newest = {}  # reward function id -> its newest version the person may pick (the list runs newest first)
    for version in form.fields["reward_version"].queryset:
        newest.setdefault(version.asset_id, version.id)
    companions = {
        str(v.id): newest[v.asset.companion_reward_id]
        for v in form.fields["script_version"].queryset
        if v.asset.companion_reward_id in newest
    }
    recommended = {
        str(m.id): {"name": m.name, "train": m.recommended_train, "learning_rate": learning_rate_used(m)}
        for m in form.fields["base_model"].queryset
    }
    return {"companions": companions, "recommended": recommended}


def _fresh_initial(form: RunLaunchForm, hints: dict) -> dict:
    """A new launch: the first script and model as the page shows them, with the script's companion
    reward preselected."""
    initial = {
        name: first.id
        for name in ("base_model", "scenario_set")
        if (first := form.fields[name].queryset.first()) is not None
    }
    first = form.fields["script_version"].queryset.first()
    if first is not None:
        initial["script_version"] = first.id
        if hints["companions"].get(str(first.id)):
            initial["reward_version"] = hints["companions"][str(first.id)]
    return initial


def _initial_from(run) -> dict:
    """Launch form values copied from an existing run ("launch similar"; a script's run only: a
    client-driven run has no script to copy, and its page offers no such link)."""
    initial = {
        "name": f"{run.name} (copy)",
        "tags": ", ".join(run.tags),
        "base_model": run.base_model_id,
        "script_version": run.script_version_id,
        "reward_version": run.reward_version_id,
        "scenario_set": run.scenario_set_id,
    }
    for key, value in (run.config or {}).items():
        # A list (hosts, secrets) as the comma-separated text its field takes.
        initial[key] = (
            json.dumps(value) if isinstance(value, dict) else ", ".join(value) if isinstance(value, list) else value
        )
    return initial


@login_required
def run_launch_view(request):
    if request.method == "POST":
        form = _launch_form(request, request.POST)
        if form.is_valid():
            try:
                run = services.run_create(owner=request.user, **form.service_kwargs())
            except ApplicationError as exc:
                apply_service_errors(form, exc, RunLaunchForm.ERROR_ALIASES)
            else:
                messages.success(request, f"Run {run.name} created and queued.")
                return redirect("run-detail", run_id=run.id)
    else:
        source = request.GET.get("from", "")
        run = run_get(user=request.user, run_id=int(source)) if source.isdigit() else None
        if run is not None and run.driver != Run.Driver.SCRIPT:
            messages.info(request, f"{run.name} is driven by an ART client: it has no script to launch again.")
            run = None
        form = _launch_form(request, initial=_initial_from(run) if run is not None else None)
    hints = _launch_hints(form)
    if request.method != "POST" and not form.initial:
        form.initial = _fresh_initial(form, hints)
    form.show_learning_rate()
    return render(
        request,
        "training/run_launch.html",
        {
            "nav": "launch",
            "form": form,
            "train_reference": train_config_reference(),
            "hints": hints,
        },
    )


@login_required
def checkpoint_download_view(request, run_id: int, checkpoint_id: int):
    run = run_get(user=request.user, run_id=run_id)
    checkpoint = get_object_or_404(checkpoint_list(run=run), id=checkpoint_id)
    try:
        path = checkpoint_archive(checkpoint=checkpoint)
    except ApplicationError as exc:
        messages.error(request, exc.message)
        return redirect(reverse("run-detail", args=[run.id]) + "#checkpoints")
    return FileResponse(path.open("rb"), as_attachment=True, filename=path.name, content_type="application/gzip")
