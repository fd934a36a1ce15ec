"""Upload forms for scripts, reward functions and scenario sets, and the dry-run form.

They only gather the upload (a file or pasted text); the services validate it and their errors are
shown inline under the field they name.
"""

from __future__ import annotations

from typing import ClassVar

from django import forms

from rollouts.services import (
    DEFAULT_DRY_RUN_SCENARIOS,
    MAX_DRY_RUN_SAMPLES,
    MAX_DRY_RUN_SCENARIOS,
)

MAX_CODE_BYTES = 1024 * 1024


class _CodeInput(forms.Form):
    """Code given as a file or pasted; a file wins when both are given."""

    file = forms.FileField(required=False, help_text="A .py file (UTF-8).")
    content = forms.CharField(
        required=False,
        label="…or paste the code",
        strip=False,
        widget=forms.Textarea(attrs={"rows": 16, "spellcheck": "false"}),
    )

    def clean(self):
        data = super().clean()
        upload = data.get("file")
        if upload:
            if upload.size > MAX_CODE_BYTES:
                self.add_error("file", f"The file is {upload.size} bytes; the limit is {MAX_CODE_BYTES}.")
                return data
            data["code"] = upload.read()
        elif data.get("content", "").strip():
            data["code"] = data["content"]
        else:
            self.add_error("content", "Choose a file or paste the code.")
        return data

    def code_text(self) -> str:
        """The submitted code as text, for showing error lines next to it."""
        code = self.cleaned_data.get("code") if hasattr(self, "cleaned_data") else None
        if isinstance(code, bytes):
            return code.decode("utf-8", errors="replace")
        return code or self.data.get("content", "")


class CodeAssetForm(_CodeInput):
    name = forms.CharField(max_length=200)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))

    field_order = ("name", "description", "file", "content")


class CodeVersionForm(_CodeInput):
    note = forms.CharField(max_length=500, required=False, help_text="What changed (optional).")

    field_order = ("file", "content", "note")


class ScenarioSetForm(forms.Form):
    name = forms.CharField(max_length=200)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    file = forms.FileField(
        required=False,
        help_text='JSONL: one JSON object per line. A line\'s own "split" key '
        '("train" or "validation") decides its split.',
    )
    content = forms.CharField(
        required=False,
        label="…or paste JSONL",
        strip=False,
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false"}),
    )
    validation_fraction = forms.FloatField(
        initial=0.2,
        min_value=0.0,
        max_value=0.99,
        widget=forms.NumberInput(attrs={"step": "0.05"}),
        help_text="Share of lines without a split held out for validation.",
    )

    def clean(self):
        data = super().clean()
        if data.get("file"):
            data["jsonl"] = data["file"].read()
        elif (data.get("content") or "").strip():
            data["jsonl"] = data["content"]
        else:
            self.add_error("file", "Choose a JSONL file or paste the scenarios.")
        return data


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

    def __init__(self, *args, script_versions, reward_versions, base_models, scenario_sets, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["script_version"].queryset = script_versions
        self.fields["script_version"].label_from_instance = lambda v: f"{v.asset.name} v{v.number}"
        self.fields["reward_version"].queryset = reward_versions
        self.fields["reward_version"].label_from_instance = lambda v: f"{v.asset.name} v{v.number}"
        self.fields["base_model"].queryset = base_models
        self.fields["scenario_set"].queryset = scenario_sets

    def clean_samples(self):
        return self.cleaned_data.get("samples") or 1  # left empty: one rollout per scenario

    @classmethod
    def prefill(cls, query) -> dict:
        """Initial values from a link's query string: the fields it names, as whole numbers."""
        return {name: int(query[name]) for name in cls.PREFILL if query.get(name, "").isdigit()}
