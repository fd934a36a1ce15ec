"""The model registry: base models the user can fine-tune, and a form to register one."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render

from artweb.errors import ApplicationError
from training.forms import BaseModelForm, apply_service_errors
from training.selectors import base_model_visible
from training.services import base_model_register


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
    return render(request, "training/model_list.html", {
        "nav": "models", "models": base_model_visible(request.user).select_related("owner"), "form": form,
    })
