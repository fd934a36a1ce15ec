"""Forms of the training pages. They collect and shape input; services validate it and decide.

The launch form is generated from RunConfig, so a new config field appears on the page with its
default, bounds and description without touching this file.
"""

from __future__ import annotations

import json
from dataclasses import MISSING
from dataclasses import fields as dataclass_fields
from typing import ClassVar, get_origin

from django import forms
from django.template.defaultfilters import filesizeformat
from django.utils import timezone
from pydantic import BaseModel as PydanticModel

from artweb.jsonlimits import json_loads_limited
from training.config import AlertRules, RunConfig
from training.engine.config import TrainConfig
from training.models import Run
from training.selectors import RUN_ORDER_LABELS
from training.services.dry_runs import DEFAULT_DRY_RUN_SCENARIOS, MAX_DRY_RUN_SAMPLES, MAX_DRY_RUN_SCENARIOS

SORTS = list(RUN_ORDER_LABELS.items())
DEFAULT_LEARNING_RATE = next(f.default for f in dataclass_fields(TrainConfig) if f.name == "learning_rate")


class RunFilterForm(forms.Form):
    q = forms.CharField(
        required=False, label="Search", widget=forms.TextInput(attrs={"type": "search", "placeholder": "name or task"})
    )
    status = forms.ChoiceField(required=False, choices=[("", "Any status"), *Run.Status.choices])
    model = forms.ChoiceField(required=False, label="Model", choices=[("", "Any model")])
    tag = forms.CharField(required=False)
    order = forms.ChoiceField(required=False, label="Sort", choices=SORTS)

    def __init__(self, *args, base_models=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["model"].choices = [("", "Any model"), *((str(m.id), m.name) for m in base_models)]

    def selector_kwargs(self) -> dict:
        data = self.cleaned_data if self.is_valid() else {}
        return {
            "q": data.get("q") or None,
            "status": data.get("status") or None,
            "base_model": data.get("model") or None,
            "tag": data.get("tag") or None,
            "order": data.get("order") or "-created_at",
        }


class BaseModelForm(forms.Form):
    name = forms.CharField(max_length=200, help_text="A short unique name, e.g. smollm2-135m.")
    source = forms.CharField(
        max_length=500,
        help_text="A Hugging Face model id (org/name); staff may also give a directory on the server with config.json.",
    )
    revision = forms.CharField(max_length=100, required=False, help_text="Git revision of a Hub model; empty: main.")
    max_length = forms.IntegerField(
        initial=2048, min_value=16, max_value=1_048_576, help_text="Context length in tokens (16 to 1,048,576)."
    )
    supports_tools = forms.BooleanField(required=False, label="Supports tool calls")
    chat_template_override = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text="Jinja chat template to use instead of the model's own.",
    )
    recommended_train = forms.CharField(
        required=False,
        label="Recommended training settings",
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": '{"learning_rate": 0.0002}'}),
        help_text="JSON object of training settings that suit this model; runs that leave a setting out take "
        "these values before artweb's defaults.",
    )

    def clean_recommended_train(self) -> dict:
        raw = (self.cleaned_data.get("recommended_train") or "").strip()
        if not raw:
            return {}
        try:
            return json_loads_limited(raw)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}.") from exc
        except ValueError as exc:  # over the depth limit, or NaN/Infinity
            raise forms.ValidationError(str(exc)) from exc


class JudgeEndpointForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Runs use it with ruler_judge endpoint:<name>.")
    base_url = forms.CharField(
        max_length=500,
        label="Base URL",
        help_text="The server's OpenAI-compatible base URL, e.g. https://api.example.com/v1.",
    )
    model = forms.CharField(max_length=200, help_text="The judge model's name at that server.")
    api_key = forms.CharField(
        required=False,
        max_length=1000,
        label="API key",
        widget=forms.PasswordInput(render_value=False),
        help_text="Sent as a bearer token by the worker; never shown again.",
    )


# --- launch -------------------------------------------------------------------------------------


def _bounds(info) -> dict:
    """min/max/exclusive bounds of a pydantic field, read off its annotated_types metadata."""
    out = {}
    for m in info.metadata:
        for attr in ("ge", "gt", "le", "lt", "max_length"):
            if getattr(m, attr, None) is not None:
                out[attr] = getattr(m, attr)
    return out


def _num(v) -> str:
    return f"{v:,}" if isinstance(v, int) else f"{v:g}"


def _bounds_text(b: dict) -> str:
    lo = f"≥ {_num(b['ge'])}" if "ge" in b else (f"> {_num(b['gt'])}" if "gt" in b else "")
    hi = f"≤ {_num(b['le'])}" if "le" in b else (f"< {_num(b['lt'])}" if "lt" in b else "")
    return ", ".join(p for p in (lo, hi) if p)


def config_form_field(name: str, info) -> forms.Field:
    """A form field for one RunConfig field: its default as initial, its bounds as min/max."""
    b = _bounds(info)
    default = info.get_default(call_default_factory=True)
    if isinstance(default, PydanticModel):
        default = default.model_dump()
    help_parts = [info.description or ""]
    bounds = _bounds_text(b)
    if bounds:
        help_parts.append(f"Allowed: {bounds}.")
    help_parts.append(f"Default: {json.dumps(default) if not isinstance(default, str) else repr(default)}.")
    common = {
        "required": False,
        "initial": default,
        "help_text": " ".join(p for p in help_parts if p),
        "label": name.replace("_", " ").capitalize(),
    }
    annotation = info.annotation
    if annotation is bool:
        return forms.BooleanField(**common)
    if annotation is int:
        return forms.IntegerField(min_value=b.get("ge"), max_value=b.get("le"), **common)
    if annotation is float:
        attrs = {"step": "any"}
        if "gt" in b:
            attrs["min"] = b["gt"]
        return forms.FloatField(
            min_value=b.get("ge"), max_value=b.get("le"), widget=forms.NumberInput(attrs=attrs), **common
        )
    if annotation is str:
        return forms.CharField(max_length=b.get("max_length"), **common)
    if isinstance(annotation, type) and issubclass(annotation, PydanticModel):  # a group of settings, as JSON
        example = next(iter(annotation.model_fields))
        common["initial"] = ""
        common["help_text"] = (
            f"{info.description or ''} A JSON object of the settings to change; the rest keep "
            f"their defaults: {json.dumps(default)}."
        )
        return forms.CharField(
            widget=forms.Textarea(attrs={"rows": 3, "placeholder": json.dumps({example: default[example]})}), **common
        )
    if get_origin(annotation) is list:
        common["initial"] = ", ".join(default)
        common["help_text"] += " Comma-separated."
        return forms.CharField(**common)
    if get_origin(annotation) is dict or annotation is dict:
        common["initial"] = json.dumps(default) if default else ""
        return forms.CharField(
            widget=forms.Textarea(
                attrs={"rows": 4, "placeholder": json.dumps({"learning_rate": DEFAULT_LEARNING_RATE})}
            ),
            **common,
        )
    raise TypeError(f"RunConfig field {name} has a type the launch form cannot show: {annotation!r}")


def train_config_reference() -> list[dict]:
    """Rows (name, default, allowed) describing the engine's TrainConfig, for the launch page."""
    rows = []
    for f in dataclass_fields(TrainConfig):
        meta = f.metadata
        default = f.default if f.default is not MISSING else f.default_factory()
        if meta.get("choices"):
            allowed = " | ".join(meta["choices"])
        elif isinstance(default, bool):
            allowed = "true | false"
        elif meta.get("lo") is not None:
            allowed = f"{'(' if meta.get('lo_open') else '['}{meta['lo']:g}, {meta['hi']:g}]"
            if meta.get("optional"):
                allowed += " or null"
        else:
            allowed = "list of module names" if isinstance(default, tuple) else ""
        rows.append(
            {
                "name": f.name,
                "default": json.dumps(list(default) if isinstance(default, tuple) else default),
                "allowed": allowed,
            }
        )
    return rows


CONFIG_FIELDS = list(RunConfig.model_fields)


def learning_rate_used(base_model) -> float:
    """The learning rate of a run that sets none: the base model's recommended one, else artweb's default."""
    recommended = (base_model.recommended_train or {}) if base_model is not None else {}
    return recommended.get("learning_rate", DEFAULT_LEARNING_RATE)


def attachments_field(attachments) -> forms.MultipleChoiceField:
    """The person's own data attachments (their rows), ticked by name: for a run and for a dry run."""
    return forms.MultipleChoiceField(
        required=False,
        choices=[(a.name, f"{a.name} ({filesizeformat(a.size)})") for a in attachments],
        widget=forms.CheckboxSelectMultiple,
        label="Data attachments",
        help_text=RunConfig.model_fields["attachments"].description + " Upload them on the Attachments page.",
    )


def default_run_name(script_version, base_model) -> str:
    """A run's name when the launch form's is left empty: what it trains, on what, and when."""
    when = timezone.localtime().strftime("%Y-%m-%d %H:%M")
    return f"{script_version.asset.name[:90]} on {base_model.name[:90]} {when}"  # within the 200 allowed


class RunLaunchForm(forms.Form):
    """Pick what to train and how. Querysets are limited to what the user may use."""

    name = forms.CharField(
        max_length=200,
        required=False,
        widget=forms.TextInput(attrs={"placeholder": "generated when left empty"}),
        help_text="Left empty: the script, the base model and the time, e.g. "
        "“Example rollout on SmolLM2-135M-Instruct 2025-06-01 14:30”.",
    )
    tags = forms.CharField(required=False, help_text="Comma-separated, e.g. baseline, lr-sweep.")
    # No blank choice on required pickers: with one model, script or set there is nothing to pick.
    base_model = forms.ModelChoiceField(queryset=None, label="Base model", empty_label=None)
    script_version = forms.ModelChoiceField(queryset=None, label="Rollout script version", empty_label=None)
    reward_version = forms.ModelChoiceField(
        queryset=None,
        required=False,
        label="Reward function version",
        empty_label="none",
        help_text="Optional: without one the script's own trajectory.reward is used (or RULER when enabled).",
    )
    scenario_set = forms.ModelChoiceField(queryset=None, label="Scenario set", empty_label=None)

    # Service error keys → form field names.
    ERROR_ALIASES: ClassVar[dict[str, str]] = {"config": "train"}

    def __init__(self, *args, base_models, script_versions, reward_versions, scenario_sets, attachments=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["base_model"].queryset = base_models
        self.fields["script_version"].queryset = script_versions
        self.fields["script_version"].label_from_instance = lambda v: f"{v.asset.name} v{v.number}"
        self.fields["reward_version"].queryset = reward_versions
        self.fields["reward_version"].label_from_instance = lambda v: f"{v.asset.name} v{v.number} ({v.kind})"
        self.fields["scenario_set"].queryset = scenario_sets
        self.fields["scenario_set"].label_from_instance = lambda s: (
            f"{s.name} ({s.train_count} train / {s.validation_count} validation)"
        )
        for name, info in RunConfig.model_fields.items():
            self.fields[name] = config_form_field(name, info)
        self.fields["attachments"] = attachments_field(attachments)

    def clean_tags(self) -> list[str]:
        return [t.strip() for t in self.cleaned_data["tags"].split(",") if t.strip()]

    def clean(self):
        data = super().clean()
        if not (data.get("name") or "").strip() and data.get("script_version") and data.get("base_model"):
            data["name"] = default_run_name(data["script_version"], data["base_model"])
        return data

    def show_learning_rate(self) -> None:
        """Show, as the training box's placeholder, the learning rate the chosen base model's run will use."""
        chosen = self.data.get("base_model") if self.is_bound else self.initial.get("base_model")
        model = self.fields["base_model"].queryset.filter(pk=chosen).first() if str(chosen or "").isdigit() else None
        example = json.dumps({"learning_rate": learning_rate_used(model)})
        self.fields["train"].widget.attrs["placeholder"] = example

    def _json_object(self, name: str, example: str) -> dict:
        raw = (self.cleaned_data.get(name) or "").strip()
        if not raw:
            return {}
        try:
            value = json_loads_limited(raw)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}.") from exc
        except ValueError as exc:  # over the depth limit, or NaN/Infinity
            raise forms.ValidationError(str(exc)) from exc
        if not isinstance(value, dict):
            raise forms.ValidationError(f"Give a JSON object, e.g. {example}.")
        return value

    def clean_train(self) -> dict:
        return self._json_object("train", '{"learning_rate": 1e-5}')

    def clean_alerts(self) -> dict:
        return self._json_object("alerts", '{"no_signal_steps": 5}')

    def config_fields(self):
        return [self[name] for name in CONFIG_FIELDS if name not in ("train", "attachments")]  # shown apart

    def config(self) -> dict:
        """The run config as entered; blank fields are left out so the schema's defaults apply."""
        out = {}
        for name in CONFIG_FIELDS:
            value = self.cleaned_data.get(name)
            if isinstance(self.fields[name], forms.BooleanField):
                out[name] = bool(value)
            elif value not in (None, "", {}) or name == "train":
                out[name] = value
        return out

    def service_kwargs(self) -> dict:
        d = self.cleaned_data
        return {
            "name": d["name"],
            "tags": d["tags"],
            "base_model": d["base_model"],
            "script_version": d["script_version"],
            "reward_version": d.get("reward_version"),
            "scenario_set": d["scenario_set"],
            "config": self.config(),
        }


class TrajectoryFilterForm(forms.Form):
    step = forms.IntegerField(required=False, min_value=0)
    split = forms.ChoiceField(
        required=False, choices=[("", "Train and validation"), ("train", "Train"), ("validation", "Validation")]
    )
    min_reward = forms.FloatField(required=False, label="Reward ≥", widget=forms.NumberInput(attrs={"step": "any"}))
    max_reward = forms.FloatField(required=False, label="Reward ≤", widget=forms.NumberInput(attrs={"step": "any"}))
    q = forms.CharField(required=False, label="Text", widget=forms.TextInput(attrs={"type": "search"}))
    errors = forms.ChoiceField(
        required=False, label="Errors", choices=[("", "Any"), ("yes", "With errors"), ("no", "Without errors")]
    )
    all_steps = forms.BooleanField(required=False, label="Search all steps")
    traj = forms.IntegerField(required=False, widget=forms.HiddenInput)

    def __init__(self, *args, steps=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.steps = list(steps)

    def filters(self) -> dict:
        data = self.cleaned_data if self.is_valid() else {}
        return {
            "step": data.get("step"),
            "split": data.get("split") or None,
            "min_reward": data.get("min_reward"),
            "max_reward": data.get("max_reward"),
            "q": (data.get("q") or "").strip() or None,
            "has_error": {"yes": True, "no": False}.get(data.get("errors") or ""),
            "all_steps": bool(data.get("all_steps")),
            "traj": data.get("traj"),
        }


class AlertRulesForm(forms.Form):
    """A run's alert rules (RunConfig.alerts), edited on its page while it runs. Generated from AlertRules,
    like the launch form from RunConfig; the service validates the values again."""

    def __init__(self, *args, rules: dict, **kwargs):
        super().__init__(*args, **kwargs)
        for name, info in AlertRules.model_fields.items():
            field = config_form_field(name, info)
            value = rules.get(name, field.initial)
            field.initial = ", ".join(value) if isinstance(value, list) else value
            self.fields[name] = field

    def changes(self) -> dict:
        """The submitted rules; blank numbers keep their current value, a blank list empties it."""
        out = {}
        for name, field in self.fields.items():
            value = self.cleaned_data.get(name)
            if isinstance(field, forms.BooleanField):
                out[name] = bool(value)
            elif get_origin(AlertRules.model_fields[name].annotation) is list:
                out[name] = [v.strip() for v in (value or "").split(",") if v.strip()]
            elif value not in (None, ""):
                out[name] = value
        return out


class DryRunForm(forms.Form):
    script_version = forms.ModelChoiceField(queryset=None, label="Script version", empty_label=None)
    reward_version = forms.ModelChoiceField(queryset=None, required=False, label="Reward version", empty_label="none")
    base_model = forms.ModelChoiceField(queryset=None, label="Base model", empty_label=None)
    scenario_set = forms.ModelChoiceField(
        queryset=None, label="Scenario set", empty_label=None, help_text="The first scenarios of the set are tried."
    )
    scenario_count = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_DRY_RUN_SCENARIOS,
        initial=DEFAULT_DRY_RUN_SCENARIOS,
        label="Scenarios",
        help_text=f"How many of the set's scenarios to try, 1 to {MAX_DRY_RUN_SCENARIOS}.",
        error_messages={
            "min_value": f"Give 1 to {MAX_DRY_RUN_SCENARIOS} scenarios.",
            "max_value": f"Give 1 to {MAX_DRY_RUN_SCENARIOS} scenarios.",
            "invalid": f"Give a whole number of scenarios, 1 to {MAX_DRY_RUN_SCENARIOS}.",
        },
    )
    samples = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_DRY_RUN_SAMPLES,
        initial=1,
        label="Samples per scenario",
        help_text=f"Rollouts per scenario, 1 to {MAX_DRY_RUN_SAMPLES}. With 2 or more the result shows whether "
        "the reward gives different rewards to different answers: the signal GRPO learns from.",
        error_messages={
            "min_value": f"Give 1 to {MAX_DRY_RUN_SAMPLES} samples per scenario.",
            "max_value": f"Give 1 to {MAX_DRY_RUN_SAMPLES} samples per scenario.",
            "invalid": f"Give a whole number of samples, 1 to {MAX_DRY_RUN_SAMPLES}.",
        },
    )

    ERROR_ALIASES: ClassVar[dict[str, str]] = {"scenarios": "scenario_set"}
    # Fields a link may prefill (the launch page's "Score the base model's answers").
    PREFILL = ("script_version", "reward_version", "base_model", "scenario_set", "scenario_count", "samples")

    def __init__(self, *args, script_versions, reward_versions, base_models, scenario_sets, attachments=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["script_version"].queryset = script_versions
        self.fields["script_version"].label_from_instance = lambda v: f"{v.asset.name} v{v.number}"
        self.fields["reward_version"].queryset = reward_versions
        self.fields["reward_version"].label_from_instance = lambda v: f"{v.asset.name} v{v.number}"
        self.fields["base_model"].queryset = base_models
        self.fields["scenario_set"].queryset = scenario_sets
        self.fields["attachments"] = attachments_field(attachments)

    def clean_samples(self):
        return self.cleaned_data.get("samples") or 1  # left empty: one rollout per scenario

    @classmethod
    def prefill(cls, query) -> dict:
        """Initial values from a link's query string: the fields it names, as whole numbers, and the
        attachments it ticks (the launch form's, by name)."""
        initial = {name: int(query[name]) for name in cls.PREFILL if query.get(name, "").isdigit()}
        if attachments := query.getlist("attachments"):
            initial["attachments"] = attachments
        return initial
