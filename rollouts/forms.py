"""Upload forms for scripts, reward functions, scenario sets and data attachments.

They only gather the upload (a file or pasted text); the services validate it and their errors are
shown inline under the field they name.
"""

from __future__ import annotations

from django import forms

from rollouts.sandbox.attachments import NAME_HELP

MAX_CODE_BYTES = 1024 * 1024


class _CodeInput(forms.Form):
    """Code given as a file or pasted; a file wins when both are given. With bundles=True (rollout scripts)
    the file may also be a .zip bundle (rollouts.sandbox.bundles), checked by the service."""

    file = forms.FileField(required=False, help_text="A .py file (UTF-8).")
    content = forms.CharField(
        required=False,
        label="…or paste the code",
        strip=False,
        widget=forms.Textarea(attrs={"rows": 16, "spellcheck": "false"}),
    )

    def __init__(self, *args, bundles: bool = False, bundle_bytes: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.bundle_bytes = bundle_bytes if bundles else 0
        if bundles:
            self.fields["file"].help_text = (
                "A .py file (UTF-8), or a .zip bundle: rollout.py at its root with helper modules, data files "
                "and pure-Python wheels."
            )

    def clean(self):
        data = super().clean()
        upload = data.get("file")
        if upload and self.bundle_bytes and upload.name.lower().endswith(".zip"):
            if upload.size > self.bundle_bytes:
                self.add_error("file", f"The bundle is {upload.size} bytes; the limit is {self.bundle_bytes}.")
                return data
            data["code_args"] = {"bundle": upload.read()}
        elif upload:
            if upload.size > MAX_CODE_BYTES:
                self.add_error("file", f"The file is {upload.size} bytes; the limit is {MAX_CODE_BYTES}.")
                return data
            data["code"] = upload.read()
        elif data.get("content", "").strip():
            data["code"] = data["content"]
        else:
            self.add_error("content", "Choose a file or paste the code.")
        if "code" in data:
            data["code_args"] = {"content": data["code"]}
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
        help_text="Share of the lines without a split held out for validation (rounded; at least one from 5 such lines on, none below 5).",
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


class AttachmentForm(forms.Form):
    file = forms.FileField(help_text="Any file your rollouts read: a SQLite database, JSON, parquet …")
    name = forms.CharField(
        max_length=100,
        required=False,
        help_text=f"Its name in the sandbox, /data/<name>; left empty, the file's own. {NAME_HELP}.",
    )
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
