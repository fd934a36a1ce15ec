"""The forms of the playground and of answer diffs: their choices are the user's own models, and the
scenarios and reward functions they may see (artweb.visibility); their bounds are the service's
(training.serving.services.serve_jobs)."""

from __future__ import annotations

from django import forms

from artweb.jsonlimits import json_loads_limited
from rollouts.selectors import reward_version_list, scenario_list, scenario_set_list
from training.serving.selectors import serve_model_list
from training.serving.services import serve_jobs as service


def _model_choices(user) -> list[tuple[str, str]]:
    return [(m["id"], m["id"]) for m in serve_model_list(user=user)]


def _reward_choices(user) -> list[tuple[str, str]]:
    return [(str(v.id), f"{v.asset.name} v{v.number}") for v in reward_version_list(user=user)]


class SamplingFields(forms.Form):
    samples = forms.IntegerField(min_value=1, max_value=service.MAX_SAMPLES, initial=2, help_text="Answers per model.")
    temperature = forms.FloatField(min_value=0.0, max_value=2.0, initial=1.0)
    max_tokens = forms.IntegerField(min_value=1, max_value=service.MAX_TOKENS, initial=128)


class PlaygroundForm(SamplingFields):
    prompt = forms.CharField(widget=forms.Textarea(attrs={"rows": 4}), required=False, max_length=20000)
    scenario = forms.ChoiceField(required=False, help_text="Or a scenario of one of your sets, instead of a prompt.")
    system = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False, max_length=20000)
    model_1 = forms.ChoiceField(label="Model 1")
    model_2 = forms.ChoiceField(label="Model 2", required=False)
    model_3 = forms.ChoiceField(label="Model 3", required=False)
    model_4 = forms.ChoiceField(label="Model 4", required=False)
    reward = forms.ChoiceField(required=False, help_text="Scores every answer (in the sandbox), or none.")
    tools = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        required=False,
        help_text="OpenAI tool definitions as a JSON list (optional).",
    )
    tool_choice = forms.CharField(
        initial="auto",
        max_length=200,
        help_text="With tools: auto (the model chooses), required, none, or a tool's name (it must call that one).",
    )

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        models = _model_choices(user)
        self.fields["model_1"].choices = models
        for k in (2, 3, 4):
            self.fields[f"model_{k}"].choices = [("", "—")] + models
        scenarios = scenario_list(user=user)
        self.fields["scenario"].choices = [("", "— (use the prompt)")] + [
            (str(s.id), f"{s.scenario_set.name} #{s.index} ({s.split})")
            for s in scenarios.order_by("scenario_set__name", "index")[:500]
        ]
        self.fields["reward"].choices = [("", "— (no scoring)")] + _reward_choices(user)

    def clean_tools(self):
        text = self.cleaned_data["tools"].strip()
        if not text:
            return None
        try:
            tools = json_loads_limited(text)
        except ValueError as exc:
            raise forms.ValidationError(f"Not JSON: {exc}. Give a list of tool definitions.") from None
        if not isinstance(tools, list):
            raise forms.ValidationError("Give a JSON list of tool definitions ([{...}]).")
        return tools


class DiffForm(SamplingFields):
    model_a = forms.ChoiceField(label="Model A", help_text="What you compare against (a base model, an earlier step).")
    model_b = forms.ChoiceField(label="Model B")
    scenario_set = forms.ChoiceField(help_text="Its held-out (validation) scenarios are answered.")
    reward = forms.ChoiceField(help_text="Scores every answer, in the sandbox.")
    max_scenarios = forms.IntegerField(min_value=1, max_value=service.MAX_DIFF_SCENARIOS, initial=50)
    seed = forms.IntegerField(min_value=0, initial=0, help_text="The same seed on both sides of each scenario.")
    system = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False, max_length=20000)

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        models = _model_choices(user)
        self.fields["model_a"].choices = models
        self.fields["model_b"].choices = models
        self.fields["scenario_set"].choices = [
            (str(s.id), f"{s.name} ({s.validation_count} held out)")
            for s in scenario_set_list(user=user).order_by("name")
        ]
        self.fields["reward"].choices = _reward_choices(user)
        self.fields["samples"].initial = 4
