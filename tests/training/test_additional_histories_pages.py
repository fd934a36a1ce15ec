"""The trajectory inspector shows a trajectory's additional histories (ART's), each labelled, below its main
transcript; a trajectory without them shows none."""

from django.urls import reverse

from artweb.testing.factories import (
    BaseModelFactory,
    RolloutScriptVersionFactory,
    RunFactory,
    TrajectoryFactory,
    TrajectoryGroupFactory,
)
from training.models import DryRun

PLANNER = {
    "messages": [
        {"role": "user", "content": "Plan the <answer>."},
        {"role": "assistant", "content": "First, add.", "token_ids": [4, 5, 6], "logprobs": [-0.5, -0.5, -0.5]},
    ],
    "tools": [{"type": "function", "function": {"name": "calculator", "parameters": {}}}],
}
CRITIC = {"messages": [{"role": "user", "content": "Was it right?"}], "tools": None}


def page(client, user, traj) -> str:
    client.force_login(user)
    url = reverse("run-trajectories", args=[traj.run_id]) + f"?step=1&traj={traj.id}"
    return client.get(url).content.decode()


def test_it_shows_each_additional_history_labelled_below_the_main_transcript(client, alice):
    group = TrajectoryGroupFactory(run=RunFactory(owner=alice), step=1)
    traj = TrajectoryFactory(
        group=group,
        index=0,
        messages=[{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "It is 4."}],
        additional_histories=[PLANNER, CRITIC],
    )
    body = page(client, alice, traj)

    main, first, second = (
        body.index("It is 4."),
        body.index("Additional history 1 of 2"),
        body.index("Additional history 2 of 2"),
    )
    assert main < first < body.index("First, add.") < second < body.index("Was it right?")
    assert "Plan the &lt;answer&gt;." in body  # the history's text, escaped
    assert "3 tokens · mean logprob -0.500" in body  # its sampled turn, as the main transcript shows one
    assert "Tools offered (1)" in body and "calculator" in body


def test_a_trajectory_without_additional_histories_shows_none(client, alice):
    group = TrajectoryGroupFactory(run=RunFactory(owner=alice), step=1)
    traj = TrajectoryFactory(group=group, index=0)
    body = page(client, alice, traj)
    assert "Say hi" in body and "Additional history" not in body


def test_another_users_trajectory_and_its_histories_stay_hidden(client, alice, bob):
    group = TrajectoryGroupFactory(run=RunFactory(owner=alice), step=1)
    traj = TrajectoryFactory(group=group, index=0, additional_histories=[CRITIC])
    client.force_login(bob)
    response = client.get(reverse("run-trajectories", args=[traj.run_id]) + f"?step=1&traj={traj.id}")
    assert response.status_code == 404 and b"Was it right?" not in response.content


def test_a_dry_runs_page_shows_each_rollouts_additional_histories(client, alice):
    dry = DryRun.objects.create(
        owner=alice,
        script_version=RolloutScriptVersionFactory(asset__owner=alice),
        base_model=BaseModelFactory(name="tiny"),
        scenarios=[{"prompt": "hi"}],
        samples=1,
        status="done",
        result={
            "trajectories": [
                {
                    "messages": [{"role": "assistant", "content": "It is 4."}],
                    "additional_histories": [PLANNER],
                    "reward": 1.0,
                    "scenario_index": 0,
                }
            ]
        },
    )
    client.force_login(alice)
    body = client.get(reverse("dry-run-detail", args=[dry.id])).content.decode()
    assert body.index("It is 4.") < body.index("Additional history 1 of 1") < body.index("First, add.")
