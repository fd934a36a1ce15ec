"""The inspector shows a trajectory's question from its scenario when the transcript lacks it."""

from __future__ import annotations

from django.urls import reverse

from artweb.presenters import scenario_question
from artweb.testing.factories import TrajectoryFactory


def test_an_answer_only_trajectory_shows_the_scenarios_question(client, alice):
    traj = TrajectoryFactory(group__run__owner=alice, messages=[{"role": "assistant", "content": "Forty-two."}])
    scenario = traj.group.scenario
    scenario.data = {"prompt": "What is six times seven?", "answer": "42"}
    scenario.save()
    client.force_login(alice)
    page = client.get(reverse("run-trajectories", args=[traj.run.id]) + f"?step={traj.step}&traj={traj.id}")
    assert page.status_code == 200
    html = page.content.decode()
    assert "question · from the scenario" in html and "What is six times seven?" in html
    assert html.index("What is six times seven?") < html.index("Forty-two.")


def test_a_transcript_with_the_question_shows_it_once():
    messages = [{"role": "user", "content": "What is six times seven?"}, {"role": "assistant", "content": "42"}]
    assert scenario_question(messages, {"prompt": "What is six times seven?"}) == ""
    answer_only = [{"role": "assistant", "content": "42"}]
    assert scenario_question(answer_only, {"question": "Six times seven?"}) == "Six times seven?"
    assert scenario_question(answer_only, {"n": 6, "prompt": ""}) == ""
    assert scenario_question(answer_only, None) == ""
