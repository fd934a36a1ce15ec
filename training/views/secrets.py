"""The Secrets page: a person's secrets for their runs' tools, write-only (training.services.tools), and
whether their runs may list named hosts here."""

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from artweb.errors import ApplicationError
from artweb.pages import apply_service_errors
from training.services import tools


class SecretForm(forms.Form):
    name = forms.CharField(
        max_length=100,
        help_text="The environment variable your run's code reads, e.g. SEARCH_API_KEY. "
        "Saving an existing name replaces its value.",
    )
    value = forms.CharField(
        max_length=tools.MAX_SECRET_CHARS,
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text="Never shown again: only its last four characters, for long values.",
    )


@login_required
def secret_list_view(request):
    form = SecretForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            secret = tools.secret_set(owner=request.user, **form.cleaned_data)
        except ApplicationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Secret {secret.name} saved: list it in a run's secrets to use it.")
            return redirect("secret-list")
    secrets = list(tools.secret_list(owner=request.user))
    for secret in secrets:
        secret.shown = tools.secret_mask_of(secret)
    return render(
        request,
        "training/secrets.html",
        {
            "nav": "secrets",
            "secrets": secrets,
            "form": form,  # a value entered is never rendered back (PasswordInput)
            "hosts_allowed": tools.named_hosts_allowed(request.user),
            "hosts_refusal": tools.named_hosts_refusal(),
            "hosts_mode": settings.ARTWEB_NAMED_HOSTS,
        },
    )


@login_required
@require_POST
def secret_delete_view(request, secret_id: int):
    secret = tools.secret_get(owner=request.user, secret_id=secret_id)
    tools.secret_delete(secret=secret)
    messages.success(request, f"Secret {secret.name} deleted.")
    return redirect("secret-list")
