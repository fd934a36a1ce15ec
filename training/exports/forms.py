"""The export target form, generated from the kind's schema (schemas.py): bounds, defaults and help text
live in one place, and the schema (through the services) does the validating.
"""

from __future__ import annotations

from typing import Literal, get_args, get_origin

from django import forms

from artweb.errors import ApplicationError
from training.exports.schemas import SCHEMAS
from training.exports.selectors import export_target_public
from training.models import ExportTarget
from training.selectors import run_visible

KEY_LABELS = {"wandb": "W&B API key", "weave": "W&B API key", "langfuse": "Langfuse secret key"}
KEY_HELP = {
    "wandb": "From your W&B settings page (API keys). Needed unless the mode is offline.",
    "weave": "The W&B API key weave traces with, from your W&B settings page.",
    "langfuse": "Your project's secret key (sk-lf-…), from the Langfuse project settings.",
}
FIXED = ("run", "enabled", "secret", "clear_secret")  # the form's own fields; the rest are settings


def _bounds(info) -> dict:
    out = {}
    for m in info.metadata:
        for attr in ("ge", "le", "max_length"):
            if getattr(m, attr, None) is not None:
                out[attr] = getattr(m, attr)
    return out


def settings_field(name: str, info) -> forms.Field:
    """A form field for one setting. Not required at the form: the schema says what is missing, and how."""
    b = _bounds(info)
    common = {
        "required": False,
        "label": name.replace("_", " ").capitalize(),
        "help_text": info.description or "",
        "initial": None if info.is_required() else info.default,
    }
    annotation = info.annotation
    if annotation is bool:
        return forms.BooleanField(**common)
    if annotation is int:
        return forms.IntegerField(min_value=b.get("ge"), max_value=b.get("le"), **common)
    if get_origin(annotation) is Literal:
        return forms.ChoiceField(choices=[(v, v) for v in get_args(annotation)], **common)
    if annotation is str:
        return forms.CharField(max_length=b.get("max_length"), **common)
    raise TypeError(f"export setting {name} has a type the form cannot show: {annotation!r}")


class ExportTargetForm(forms.Form):
    """One kind's settings, the key (write-only), and on creation the run it applies to."""

    enabled = forms.BooleanField(
        required=False,
        initial=True,
        label="Enabled",
        help_text="Switched off, nothing is sent (a run's disabled target opts the run out).",
    )

    def __init__(self, *args, kind: str, user, target: ExportTarget | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.kind = kind
        if target is None:
            self.fields["run"] = forms.ModelChoiceField(
                queryset=run_visible(user).order_by("-created_at"),
                required=False,
                empty_label="All my runs",
                label="Applies to",
                help_text="One run only: it then takes the place of your all-runs target of this kind.",
            )
            self.fields["run"].label_from_instance = lambda r: f"#{r.id} {r.name}"
            self.order_fields(["run"])
        for name, info in SCHEMAS[kind].model_fields.items():
            self.fields[name] = settings_field(name, info)
            if target is not None and name in target.settings:
                self.initial[name] = target.settings[name]
        help_text = KEY_HELP[kind] + " Stored encrypted; never shown again."
        if target is not None:
            public = export_target_public(target)
            self.initial["enabled"] = target.enabled
            help_text += (
                f" Stored now: {public['secret']}. Leave empty to keep it."
                if target.secret_encrypted
                else " None is stored now."
            )
        self.fields["secret"] = forms.CharField(
            required=False,
            max_length=1000,
            label=KEY_LABELS[kind],
            help_text=help_text,
            strip=True,
            widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        )
        if target is not None and target.secret_encrypted:
            self.fields["clear_secret"] = forms.BooleanField(required=False, label="Remove the stored key")

    def settings(self) -> dict:
        """The settings as entered; empty fields are left out, so the schema's defaults apply (and a
        required one is reported as missing)."""
        return {
            name: value for name, value in self.cleaned_data.items() if name not in FIXED and value not in (None, "")
        }

    def settings_fields(self):
        return [self[name] for name in self.fields if name not in FIXED]

    def apply_errors(self, exc: ApplicationError) -> None:
        """The service's field errors under their fields ("settings.project" → project), the rest on top."""
        placed = False
        for key, msgs in exc.field_errors.items():
            name = key.removeprefix("settings.").split(".", 1)[0]
            if name in self.fields:
                for message in msgs:
                    self.add_error(name, message)
                placed = True
        if not placed:
            self.add_error(None, exc.message)
