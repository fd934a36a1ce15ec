"""Pages for rollout scripts, reward functions, scenario sets and data attachments.

Scripts and reward functions are the same kind of thing to a person (named code with versions), so
one set of views serves both, told apart by the ASSETS entry the URL names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from artweb.errors import ApplicationError
from artweb.pages import apply_service_errors, panels_render
from artweb.presenters import code_diff_table, code_with_errors
from rollouts import attachments, selectors, services
from rollouts.forms import AttachmentForm, CodeAssetForm, CodeVersionForm, ScenarioSetForm
from rollouts.sandbox.attachments import DATA_INSIDE


@dataclass(frozen=True)
class AssetKind:
    slug: str
    label: str
    plural: str
    get: Callable
    list: Callable
    create: Callable
    version_create: Callable
    version_arg: str  # the keyword its version_create takes the asset as


ASSETS = {
    "script": AssetKind(
        "script",
        "Rollout script",
        "Rollout scripts",
        get=lambda user, pk: selectors.script_get(user=user, script_id=pk),
        list=lambda user: selectors.script_list(user=user),
        create=services.script_create,
        version_create=services.script_version_create,
        version_arg="script",
    ),
    "reward": AssetKind(
        "reward",
        "Reward function",
        "Reward functions",
        get=lambda user, pk: selectors.reward_get(user=user, reward_id=pk),
        list=lambda user: selectors.reward_list(user=user),
        create=services.reward_create,
        version_create=services.reward_version_create,
        version_arg="reward",
    ),
}


def _kind(kind: str) -> AssetKind:
    if kind not in ASSETS:
        raise Http404
    return ASSETS[kind]


def _bundles(k: AssetKind) -> dict:
    """The upload form's arguments: a rollout script may also be a .zip bundle, within the API's limit."""
    return {"bundles": True, "bundle_bytes": selectors.bundle_upload_bytes()} if k.slug == "script" else {}


def _code_errors(form, exc: ApplicationError) -> list[dict]:
    """Show the service's errors under the code and return the offending lines, numbered."""
    apply_service_errors(form, exc, {"file": "content"} if "content" in form.fields else {})
    return code_with_errors(form.code_text(), exc.field_errors.get("content", []))


@login_required
def asset_list_view(request, kind: str):
    k = _kind(kind)
    assets = k.list(request.user).select_related("owner").prefetch_related("versions")
    return render(request, "rollouts/asset_list.html", {"nav": f"{k.slug}s", "kind": k, "assets": assets})


@login_required
def asset_create_view(request, kind: str):
    k = _kind(kind)
    form = CodeAssetForm(request.POST or None, request.FILES or None, **_bundles(k))
    error_lines = []
    if request.method == "POST" and form.is_valid():
        d = form.cleaned_data
        try:
            version = k.create(owner=request.user, name=d["name"], description=d["description"], **d["code_args"])
        except ApplicationError as exc:
            error_lines = _code_errors(form, exc)
        else:
            messages.success(request, f"{k.label} {version.asset.name} uploaded (version 1).")
            return redirect(f"{k.slug}-detail", asset_id=version.asset_id)
    return render(
        request, "rollouts/asset_form.html", {"nav": f"{k.slug}s", "kind": k, "form": form, "error_lines": error_lines}
    )


@login_required
def asset_detail_view(request, kind: str, asset_id: int):
    k = _kind(kind)
    asset = k.get(request.user, asset_id)
    form = CodeVersionForm(request.POST or None, request.FILES or None, **_bundles(k))
    error_lines = []
    if request.method == "POST" and form.is_valid():
        try:
            version = k.version_create(
                **{k.version_arg: asset}, note=form.cleaned_data["note"], **form.cleaned_data["code_args"]
            )
        except ApplicationError as exc:
            error_lines = _code_errors(form, exc)
        else:
            messages.success(request, f"Version {version.number} saved.")
            return redirect(f"{k.slug}-detail", asset_id=asset.id)

    versions = list(asset.versions.order_by("-number"))
    by_number = {v.number: v for v in versions}
    shown = by_number.get(int(request.GET["v"])) if request.GET.get("v", "").isdigit() else None
    shown = shown or (versions[0] if versions else None)
    diff = None
    # Default diff: the newest version against the one before it.
    a = request.GET.get("a", str(versions[1].number) if len(versions) > 1 else "")
    b = request.GET.get("b", str(versions[0].number) if versions else "")
    if a.isdigit() and b.isdigit() and int(a) in by_number and int(b) in by_number:
        old, new = by_number[int(a)], by_number[int(b)]
        diff = {
            "old": old,
            "new": new,
            "table": code_diff_table(old.content, new.content, f"version {old.number}", f"version {new.number}"),
        }
    files, files_error = selectors.script_version_files(shown) if shown and k.slug == "script" else ([], None)
    file_shown = next((f for f in files if f.name == request.GET.get("file")), None)
    # Panels other apps add under the asset (training's dry-run form), prefilled with its newest version.
    panels = panels_render("asset-detail", request, initial={f"{k.slug}_version": versions[0].id} if versions else None)
    rewards = (
        selectors.reward_list(user=request.user).filter(owner=asset.owner).order_by("name")
        if k.slug == "script"
        else None
    )
    return render(
        request,
        "rollouts/asset_detail.html",
        {
            "nav": f"{k.slug}s",
            "kind": k,
            "asset": asset,
            "versions": versions,
            "shown": shown,
            "diff": diff,
            "companion_choices": rewards,
            "form": form,
            "error_lines": error_lines,
            "panels": panels,
            "files": files,
            "files_error": files_error,
            "file_shown": file_shown,
        },
    )


@login_required
@require_POST
def script_companion_view(request, asset_id: int):
    script = selectors.script_get(user=request.user, script_id=asset_id)
    raw = request.POST.get("reward", "")
    reward = selectors.reward_get(user=request.user, reward_id=int(raw)) if raw.isdigit() else None
    try:
        services.script_companion_set(script=script, reward=reward)
    except ApplicationError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(
            request,
            f"The launch form now preselects {reward.name} with this script."
            if reward
            else "This script has no companion reward now.",
        )
    return redirect("script-detail", asset_id=script.id)


# --- scenario sets ----------------------------------------------------------------------------------

SCENARIO_PREVIEW = 50


@login_required
def scenario_set_list_view(request):
    return render(
        request,
        "rollouts/scenario_set_list.html",
        {
            "nav": "scenarios",
            "sets": selectors.scenario_set_list(user=request.user).select_related("owner"),
        },
    )


@login_required
def scenario_set_create_view(request):
    form = ScenarioSetForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        d = form.cleaned_data
        try:
            scenario_set = services.scenario_set_create(
                owner=request.user,
                name=d["name"],
                jsonl=d["jsonl"],
                validation_fraction=d["validation_fraction"],
                description=d["description"],
            )
        except ApplicationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Scenario set {scenario_set.name} created.")
            return redirect("scenario-set-detail", scenario_set_id=scenario_set.id)
    return render(request, "rollouts/scenario_set_form.html", {"nav": "scenarios", "form": form})


@login_required
def scenario_set_detail_view(request, scenario_set_id: int):
    scenario_set = selectors.scenario_set_get(user=request.user, scenario_set_id=scenario_set_id)
    return render(
        request,
        "rollouts/scenario_set_detail.html",
        {
            "nav": "scenarios",
            "scenario_set": scenario_set,
            "scenarios": scenario_set.scenarios.order_by("index")[:SCENARIO_PREVIEW],
            "preview": SCENARIO_PREVIEW,
            "panels": panels_render("scenario-set-detail", request, initial={"scenario_set": scenario_set.id}),
        },
    )


# --- data attachments -------------------------------------------------------------------------------


def _attachment_page(request, form: AttachmentForm):
    return render(
        request,
        "rollouts/attachment_list.html",
        {
            "nav": "attachments",
            "form": form,
            "attachments": selectors.attachment_list(user=request.user).select_related("owner"),
            "data_inside": DATA_INSIDE,
            "max_bytes": selectors.attachment_max_bytes(),
        },
    )


@login_required
def attachment_list_view(request):
    return _attachment_page(request, AttachmentForm())


@login_required
@require_POST
def attachment_create_view(request):
    form = AttachmentForm(request.POST, request.FILES)
    if form.is_valid():
        d = form.cleaned_data
        try:
            attachment, created = attachments.attachment_create(
                owner=request.user,
                source=d["file"],
                name=d["name"] or d["file"].name,
                size=d["file"].size,
                description=d["description"],
            )
        except ApplicationError as exc:
            apply_service_errors(form, exc)
        else:
            said = "uploaded" if created else "was already uploaded with this content"
            messages.success(request, f"{attachment.name} {said}: runs read it at {DATA_INSIDE}/{attachment.name}.")
            return redirect("attachment-list")
    return _attachment_page(request, form)


@login_required
@require_POST
def attachment_delete_view(request, attachment_id: int):
    attachment = selectors.attachment_get(user=request.user, attachment_id=attachment_id)
    try:
        attachments.attachment_delete(attachment=attachment, actor=request.user)
    except ApplicationError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"{attachment.name} deleted.")
    return redirect("attachment-list")
