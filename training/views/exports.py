"""Export targets' pages: the list, a form to add one of a kind, each target's page (change it, send a
test event, delete it). Only the user's own targets, staff too; someone else's is a 404 (a setting:
artweb.visibility.own). A target may be for any run the user may see.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from artweb.errors import ApplicationError
from training.exports import services
from training.exports.forms import ExportTargetForm
from training.exports.selectors import export_target_get, export_target_list, export_target_public
from training.models import ExportTarget
from training.selectors import run_visible


def _kind(kind: str) -> str:
    if kind not in ExportTarget.Kind.values:
        raise Http404("no such export kind")
    return kind


@login_required
def export_list_view(request):
    run = None
    if request.GET.get("run", "").isdigit():
        run = run_visible(request.user).filter(id=int(request.GET["run"])).first()
    targets = export_target_list(owner=request.user, run=run)
    return render(
        request,
        "training/export_list.html",
        {
            "nav": "exports",
            "targets": [(t, export_target_public(t)) for t in targets],
            "run": run,
            "kinds": ExportTarget.Kind.choices,
        },
    )


@login_required
def export_create_view(request, kind: str):
    kind = _kind(kind)
    initial = {"run": request.GET["run"]} if request.GET.get("run", "").isdigit() else {}
    form = ExportTargetForm(request.POST or None, kind=kind, user=request.user, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            target = services.export_target_create(
                owner=request.user,
                kind=kind,
                settings=form.settings(),
                secret=form.cleaned_data["secret"],
                run=form.cleaned_data["run"],
                enabled=form.cleaned_data["enabled"],
            )
        except ApplicationError as exc:
            form.apply_errors(exc)
        else:
            messages.success(request, f"{target.get_kind_display()} export added. Send a test event to check it.")
            return redirect("export-detail", target_id=target.id)
    return render(
        request,
        "training/export_form.html",
        {
            "nav": "exports",
            "form": form,
            "kind_label": ExportTarget.Kind(kind).label,
            "target": None,
        },
    )


@login_required
def export_detail_view(request, target_id: int):
    target = export_target_get(user=request.user, target_id=target_id)
    form = ExportTargetForm(request.POST or None, kind=target.kind, user=request.user, target=target)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        # An empty key field keeps the stored key; only the checkbox removes it.
        secret = "" if data.get("clear_secret") else (data["secret"] or None)
        try:
            services.export_target_update(
                target=target, actor=request.user, settings=form.settings(), secret=secret, enabled=data["enabled"]
            )
        except ApplicationError as exc:
            form.apply_errors(exc)
        else:
            messages.success(request, "Export settings saved.")
            return redirect("export-detail", target_id=target.id)
    return render(
        request,
        "training/export_form.html",
        {
            "nav": "exports",
            "form": form,
            "kind_label": target.get_kind_display(),
            "target": target,
            "public": export_target_public(target),
        },
    )


@login_required
@require_POST
def export_test_view(request, target_id: int):
    target = export_target_get(user=request.user, target_id=target_id)
    result = services.export_target_test(target=target, actor=request.user)
    if result.ok:
        messages.success(request, f"Test event sent. {result.message}")
    else:
        messages.error(request, f"Test event failed: {result.message}")
    return redirect("export-detail", target_id=target.id)


@login_required
@require_POST
def export_delete_view(request, target_id: int):
    target = export_target_get(user=request.user, target_id=target_id)
    label = f"{target.get_kind_display()} export for {f'run #{target.run_id}' if target.run_id else 'all your runs'}"
    services.export_target_delete(target=target, actor=request.user)
    messages.success(request, f"{label} deleted.")
    return redirect("export-list")
