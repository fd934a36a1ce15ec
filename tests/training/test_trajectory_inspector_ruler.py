"""The trajectory inspector shows the RULER judge's rationale of a judged trajectory."""

from django.urls import reverse

from artweb.testing.factories import RunFactory, TrajectoryFactory, TrajectoryGroupFactory


def page(client, user, traj):
    client.force_login(user)
    return client.get(reverse("run-trajectories", args=[traj.run_id]) + f"?step=1&traj={traj.id}").content.decode()


def test_it_shows_the_judges_rationale_next_to_the_scores(client, alice):
    group = TrajectoryGroupFactory(run=RunFactory(owner=alice), step=1)
    traj = TrajectoryFactory(
        group=group,
        index=0,
        reward=0.9,
        metrics={"ruler_score": 0.9, "independent_reward": 0.25},
        metadata={"ruler_explanation": "Answered <b>4</b>, directly.\nNo detours."},
    )
    body = page(client, alice, traj)
    assert "Judge's rationale" in body
    assert "RULER score 0.900 · independent reward 0.250" in body
    assert "Answered &lt;b&gt;4&lt;/b&gt;, directly.<br>No detours." in body  # the judge's text, escaped


def test_it_shows_no_rationale_for_a_trajectory_the_judge_did_not_score(client, alice):
    group = TrajectoryGroupFactory(run=RunFactory(owner=alice), step=1)
    traj = TrajectoryFactory(group=group, index=0, reward=1.0, metadata={"note": "x"})
    assert "rationale" not in page(client, alice, traj)
