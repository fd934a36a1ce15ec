"""The playground (one prompt, up to four models side by side) and answer diffs (two models over a scenario
set's held-out split). Both queue a ServeJob (training.services.serve_jobs) and show it when done."""

from __future__ import annotations

import json

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render

from artweb.errors import ApplicationError
from artweb.jsonlimits import json_loads_limited
from artweb.pages import apply_service_errors
from rollouts.models import RewardFunctionVersion, Scenario, ScenarioSet
from training.models import ServeJob
from training.services import serve_jobs as service
from training.services.serving import serve_model_list

K = ServeJob.Kind


def _model_choices(user) -> list[tuple[str, str]]:
    return [(m["id"], m["id"]) for m in serve_model_list(user=user)]


def _reward_choices(user) -> list[tuple[str, str]]:
    versions = RewardFunctionVersion.objects.filter(asset__owner=user).select_related("asset")
    return [(str(v.id), f"{v.asset.name} v{v.number}") for v in versions.order_by("asset__name", "-number")]


class _SamplingFields(forms.Form):
    samples = forms.IntegerField(min_value=1, max_value=service.MAX_SAMPLES, initial=2, help_text="Answers per model.")
    temperature = forms.FloatField(min_value=0.0, max_value=2.0, initial=1.0)
    max_tokens = forms.IntegerField(min_value=1, max_value=service.MAX_TOKENS, initial=128)


class PlaygroundForm(_SamplingFields):
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
        scenarios = Scenario.objects.filter(scenario_set__owner=user).select_related("scenario_set")
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


@login_required
def playground_view(request, job_id: int | None = None):
    user = request.user
    job = service.serve_job_get(user=user, job_id=job_id, kind=K.PLAYGROUND) if job_id else None
    initial = {}
    if job is not None:
        p = job.params
        initial = {
            "prompt": p.get("prompt", ""),
            "system": p.get("system", ""),
            "scenario": str(p["scenario"]) if p.get("scenario") else "",
            "samples": p.get("samples"),
            "temperature": p.get("temperature"),
            "max_tokens": p.get("max_tokens"),
            "reward": str(job.reward_version_id or ""),
            "tools": (p["tools"] if isinstance(p["tools"], str) else json.dumps(p["tools"])) if p.get("tools") else "",
            "tool_choice": p.get("tool_choice", "auto"),
            **{f"model_{k + 1}": name for k, name in enumerate(job.model_names)},
        }
    form = PlaygroundForm(request.POST or None, user=user, initial=initial)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            new = service.playground_create(
                user=user,
                models=[data[f"model_{k}"] for k in (1, 2, 3, 4) if data.get(f"model_{k}")],
                prompt=data["prompt"],
                system=data["system"],
                scenario=Scenario.objects.filter(id=data["scenario"], scenario_set__owner=user).first()
                if data["scenario"]
                else None,
                tools=data["tools"],
                tool_choice=data["tool_choice"],
                reward_version=RewardFunctionVersion.objects.filter(id=data["reward"], asset__owner=user).first()
                if data["reward"]
                else None,
                samples=data["samples"],
                temperature=data["temperature"],
                max_tokens=data["max_tokens"],
            )
        except ApplicationError as exc:
            apply_service_errors(form, exc, aliases={"models": "model_1", "reward_version": "reward"})
        else:
            return redirect("playground-session", job_id=new.id)
    return render(
        request,
        "training/playground.html",
        {"nav": "playground", "form": form, "job": job, "result": job.result if job else None},
    )


class DiffForm(_SamplingFields):
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
            for s in ScenarioSet.objects.filter(owner=user).order_by("name")
        ]
        self.fields["reward"].choices = _reward_choices(user)
        self.fields["samples"].initial = 4


@login_required
def diff_list_view(request):
    user = request.user
    form = DiffForm(request.POST or None, user=user)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            job = service.diff_create(
                user=user,
                model_a=data["model_a"],
                model_b=data["model_b"],
                scenario_set=ScenarioSet.objects.get(id=data["scenario_set"], owner=user),
                reward_version=RewardFunctionVersion.objects.filter(id=data["reward"], asset__owner=user).first(),
                samples=data["samples"],
                temperature=data["temperature"],
                max_tokens=data["max_tokens"],
                max_scenarios=data["max_scenarios"],
                system=data["system"],
                seed=data["seed"],
            )
        except ApplicationError as exc:
            apply_service_errors(form, exc, aliases={"models": "model_a", "reward_version": "reward"})
        else:
            messages.success(request, f"Answer diff #{job.id} queued; this page follows it.")
            return redirect("diff-detail", job_id=job.id)
    return render(
        request,
        "training/diff_list.html",
        {"nav": "diffs", "form": form, "jobs": service.serve_job_list(user=user, kind=K.DIFF)[:100]},
    )


@login_required
def diff_detail_view(request, job_id: int):
    job = service.serve_job_get(user=request.user, job_id=job_id, kind=K.DIFF)
    rows = list(service.diff_scenarios(job=job).select_related("scenario")[:500])
    return render(request, "training/diff_detail.html", {"nav": "diffs", "job": job, "rows": rows})
