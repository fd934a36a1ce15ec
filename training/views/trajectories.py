"""The trajectory inspector: one step's groups side by side, and one trajectory as a transcript."""

from __future__ import annotations

from django import forms
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render

from artweb.presenters import history_transcripts, scenario_question, transcript
from training.forms import TrajectoryFilterForm
from training.selectors import group_list, run_get, run_trajectory_steps, trajectory_list

# The list columns; the heavy JSON (messages, logs) is read only for the trajectory that is open.
LIST_FIELDS = (
    "id",
    "group_id",
    "step",
    "index",
    "reward",
    "advantage",
    "error",
    "prompt_tokens",
    "completion_tokens",
    "duration_ms",
)
MAX_FLAT_RESULTS = 200


class InspectorFilterForm(TrajectoryFilterForm):
    """The inspector's filters and one more: a scenario, by its index (what the heatmap links to)."""

    scenario = forms.IntegerField(
        required=False, min_value=0, label="Scenario #", widget=forms.NumberInput(attrs={"style": "width: 6rem"})
    )

    def filters(self) -> dict:
        data = self.cleaned_data if self.is_valid() else {}
        return {**super().filters(), "scenario": data.get("scenario")}


def _prefixed(group_filter: dict) -> dict:
    """A filter on groups, applied to trajectories through their group."""
    return {f"group__{key}": value for key, value in group_filter.items()}


@login_required
def trajectory_inspector_view(request, run_id: int):
    run = run_get(user=request.user, run_id=run_id)
    steps = run_trajectory_steps(run=run)
    form = InspectorFilterForm(request.GET or None, steps=steps)
    f = form.filters()
    step = f["step"] if f["step"] in steps else (steps[-1] if steps else None)
    filters = {
        "split": f["split"],
        "min_reward": f["min_reward"],
        "max_reward": f["max_reward"],
        "q": f["q"],
        "has_error": f["has_error"],
    }

    # Scenario indexes are unique within the run's scenario set, so the index names one scenario.
    same_scenario = {} if f["scenario"] is None else {"scenario__index": f["scenario"]}
    groups, flat = [], []
    if f["all_steps"]:
        flat = list(
            trajectory_list(run=run, **filters).filter(**_prefixed(same_scenario)).only(*LIST_FIELDS)[:MAX_FLAT_RESULTS]
        )
    elif step is not None:
        trajs = trajectory_list(run=run, step=step, **filters).filter(**_prefixed(same_scenario)).only(*LIST_FIELDS)
        by_group: dict[int, list] = {}
        for t in trajs:
            by_group.setdefault(t.group_id, []).append(t)
        groups = [
            {"group": g, "trajectories": by_group.get(g.id, [])}
            for g in group_list(run=run, step=step, split=f["split"]).filter(**same_scenario)
        ]

    selected = None
    if f["traj"]:
        selected = get_object_or_404(trajectory_list(run=run).select_related("group__scenario"), id=f["traj"])

    query = request.GET.copy()
    query.pop("traj", None)
    step_query = query.copy()
    step_query.pop("step", None)
    position = steps.index(step) if step in steps else None
    return render(
        request,
        "training/trajectories.html",
        {
            "nav": "runs",
            "run": run,
            "form": form,
            "steps": steps,
            "step": step,
            "prev_step": steps[position - 1] if position else None,
            "next_step": steps[position + 1] if position is not None and position + 1 < len(steps) else None,
            "groups": groups,
            "flat": flat,
            "all_steps": f["all_steps"],
            "selected": selected,
            "turns": transcript(selected.messages) if selected else [],
            "histories": history_transcripts(selected.additional_histories) if selected else [],
            "question": scenario_question(selected.messages, getattr(selected.group.scenario, "data", None))
            if selected
            else "",
            "query": query.urlencode(),
            "step_query": step_query.urlencode(),
        },
    )
