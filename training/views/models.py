"""The model registry: base models the user can fine-tune, and a form to register one."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from artweb.errors import ApplicationError
from artweb.pages import apply_service_errors
from training.exports.crypto import secret_mask
from training.forms import BaseModelForm, JudgeEndpointForm
from training.selectors import base_model_visible, judge_endpoint_get, judge_endpoint_list
from training.services import base_model_register
from training.services.judges import judge_endpoint_create, judge_endpoint_delete
from training.services.model_files import source_shown


@login_required
def model_list_view(request):
    form = BaseModelForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            model = base_model_register(owner=request.user, **form.cleaned_data)
        except ApplicationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Model {model.name} registered.")
            return redirect("model-list")
    return _page(request, form=form)


def _shown(model, user):
    model.source_shown = source_shown(model.source, user)  # a server directory's path: staff only
    return model


def _page(request, *, form=None, judge_form=None):
    judges = list(judge_endpoint_list(owner=request.user))
    for judge in judges:
        judge.key_shown = secret_mask(judge.key_last4) if judge.key_encrypted else "none"
    return render(
        request,
        "training/model_list.html",
        {
            "nav": "models",
            "models": [_shown(m, request.user) for m in base_model_visible(request.user).select_related("owner")],
            "form": form or BaseModelForm(),
            "judges": judges,
            "judge_form": judge_form or JudgeEndpointForm(prefix=JUDGE_PREFIX),
        },
    )


JUDGE_PREFIX = "judge"  # the page holds two forms: their fields must not share names and ids


@login_required
@require_POST
def judge_create_view(request):
    form = JudgeEndpointForm(request.POST, prefix=JUDGE_PREFIX)
    if form.is_valid():
        try:
            judge = judge_endpoint_create(owner=request.user, **form.cleaned_data)
        except ApplicationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Judge {judge.name} saved: use it with ruler_judge endpoint:{judge.name}.")
            return redirect("model-list")
    return _page(request, judge_form=form)


@login_required
@require_POST
def judge_delete_view(request, endpoint_id: int):
    judge = judge_endpoint_get(user=request.user, endpoint_id=endpoint_id)
    judge_endpoint_delete(endpoint=judge)
    messages.success(request, f"Judge {judge.name} deleted.")
    return redirect("model-list")
