"""Page plumbing both apps use: a service's errors shown on a form, and panels one app adds to another's page.

Panels are how a training form appears on a rollouts page (the dry-run form under a script or a scenario
set) without rollouts importing training: training registers a builder for the page when the app loads,
and the rollouts view renders whatever is registered.
"""

from __future__ import annotations

from collections.abc import Callable

from django import forms
from django.utils.safestring import SafeString, mark_safe

from artweb.errors import ApplicationError

# page name -> builders; each takes the request and the page's keyword arguments and returns HTML.
_panels: dict[str, list[Callable[..., str]]] = {}


def panel_register(page: str, builder: Callable[..., str]) -> None:
    """Add a panel to a page; registering the same builder again does nothing (apps may load twice in tests)."""
    builders = _panels.setdefault(page, [])
    if builder not in builders:
        builders.append(builder)


def panels_render(page: str, request, **kwargs) -> SafeString:
    """The page's registered panels, rendered in registration order."""
    # Safe: each builder returns a rendered template, escaped by the template engine.
    return mark_safe("".join(builder(request, **kwargs) for builder in _panels.get(page, ())))


def apply_service_errors(form: forms.Form, exc: ApplicationError, aliases: dict[str, str] | None = None) -> None:
    """Show an ApplicationError on the form: field errors under their fields, and the error's message on top
    unless a field error already says it (a short field label, e.g. "not in this server's model cache",
    leaves the message that says what to do on top)."""
    aliases = aliases or {}
    placed: list[str] = []
    for key, messages in exc.field_errors.items():
        name = aliases.get(key, key)
        if "." in name and name not in form.fields:
            name = aliases.get(name.split(".", 1)[0], name.split(".", 1)[0])
        if name in form.fields:
            detail = key.split(".", 1)[1] + ": " if "." in key and name != key else ""
            for message in messages:
                form.add_error(name, f"{detail}{message}")
                placed.append(str(message))
    if not any(exc.message in message for message in placed):
        form.add_error(None, exc.message)
