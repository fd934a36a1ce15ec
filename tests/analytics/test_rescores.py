"""Re-scoring a run's stored trajectories: the real jailed sandbox runs real reward code over a seeded run.

Runs are seeded (groups and trajectories written as a step writes them, Steps and Checkpoints beside
them): a re-score reads only what is stored, so nothing else of a run is needed. The figures are checked
against a hand computation written out in the test.
"""

from __future__ import annotations

import math
from unittest import mock

import pytest

from artweb.errors import ApplicationError
from artweb.testing.factories import (
    CheckpointFactory,
    RewardFunctionVersionFactory,
    RunFactory,
    StepFactory,
)
from training.analytics import rescores
from training.analytics.rescores import rescore_create, rescore_execute
from training.models import Checkpoint, Rescore, RescoreScore, Step, Trajectory, TrajectoryGroup

pytestmark = pytest.mark.django_db

# The new reward: the length of the policy's last answer. It reads the answer through the Choice object, as
# a reward function does in a step (the stored message is turned back into one).
LENGTH_REWARD = """def reward(trajectory, scenario):
    answer = trajectory.messages_and_choices[-1].message.content
    trajectory.metrics["chars"] = len(answer)
    return float(len(answer))
"""


def answer(text: str) -> list[dict]:
    """A stored conversation whose last message the policy sampled (as groups_persist stores it)."""
    return [
        {"role": "user", "content": "Say something."},
        {
            "role": "assistant",
            "content": text,
            "token_ids": [1] * len(text),
            "logprobs": [-0.5] * len(text),
            "finish_reason": "stop",
        },
    ]


def seed_group(
    run, step: int, rows: list[tuple[float | None, str]], *, split="train", failed=False, error: str = ""
) -> TrajectoryGroup:
    """A stored group: (old reward, answer) per trajectory; an answer of "" is a rollout that failed."""
    scenario = run.scenario_set.scenarios.filter(split=split).first()
    group = TrajectoryGroup.objects.create(run=run, step=step, split=split, scenario=scenario, failed_attempt=failed)
    for i, (reward, text) in enumerate(rows):
        Trajectory.objects.create(
            group=group,
            run=run,
            step=step,
            index=i,
            reward=reward,
            messages=answer(text) if text else [],
            error=error if not text else "",
            metrics={"from_the_run": 1},
        )
    return group


def seed_run(owner, *, steps_done: int, **kwargs):
    run = RunFactory(owner=owner, steps_done=steps_done, num_steps=max(steps_done, 1), status="completed", **kwargs)
    for step in range(1, steps_done + 1):
        StepFactory(run=run, step=step)
        CheckpointFactory(run=run, step=step)
    return run


def new_reward(owner, content=LENGTH_REWARD, kind="trajectory"):
    return RewardFunctionVersionFactory(asset__owner=owner, content=content, kind=kind)


def training_state(run) -> tuple:
    return (
        list(Step.objects.filter(run=run).order_by("step").values_list("step", "reward_mean", "metrics")),
        list(Checkpoint.objects.filter(run=run).order_by("step").values_list("step", "path", "state")),
        list(Trajectory.objects.filter(run=run).order_by("id").values_list("id", "reward", "metrics", "advantage")),
    )


@pytest.fixture
def small_run(alice):
    """Two committed steps of one group each, plus what a re-score must leave out: a failed attempt, a
    failed rollout, and a step still in progress (its groups are stored, the step is not committed)."""
    run = seed_run(alice, steps_done=2)
    seed_group(run, 1, [(0.0, "bb"), (1.0, "a"), (0.5, "ccc")])
    seed_group(run, 2, [(1.0, "dddd"), (0.0, "a"), (0.5, "bb")])
    seed_group(run, 2, [(None, "zzzzzzzz")], failed=True)
    seed_group(run, 2, [(None, "")], error="The rollout failed: boom")
    seed_group(run, 3, [(0.5, "in progress")])
    return run


def test_it_rescores_a_small_run_and_its_figures_match_a_hand_computation(
    alice, small_run, django_capture_on_commit_callbacks
):
    before = training_state(small_run)
    # No worker runs here: the message is caught on its way to the broker, after the commit.
    with (
        mock.patch("training.tasks.rescore_execute_task.apply_async") as send,
        django_capture_on_commit_callbacks(execute=True),
    ):
        rescore = rescore_create(user=alice, run=small_run, reward_version=new_reward(alice))
        send.assert_not_called()
    send.assert_called_once_with(args=(rescore.id,), kwargs={})
    rescore.refresh_from_db()
    assert rescore.status == "queued" and rescore.dispatched_at is not None

    rescore_execute(rescore_id=rescore.id)

    rescore.refresh_from_db()
    assert rescore.status == "done", rescore.error
    assert (rescore.trajectories_total, rescore.trajectories_done) == (6, 6)
    scores = {
        (s.step, s.trajectory.index): s
        for s in RescoreScore.objects.filter(rescore=rescore).select_related("trajectory")
    }
    assert {k: (s.old_reward, s.new_reward) for k, s in scores.items()} == {
        (1, 0): (0.0, 2.0),
        (1, 1): (1.0, 1.0),
        (1, 2): (0.5, 3.0),
        (2, 0): (1.0, 4.0),
        (2, 1): (0.0, 1.0),
        (2, 2): (0.5, 2.0),
    }
    assert scores[(1, 2)].metrics == {"from_the_run": 1, "chars": 3}
    assert all(s.error == "" and s.reward_ms is not None for s in scores.values())

    # By hand. old = [0, 1, .5, 1, 0, .5], new = [2, 1, 3, 4, 1, 2].
    # Average ranks: old [1.5, 5.5, 3.5, 5.5, 1.5, 3.5], new [3.5, 1.5, 5, 6, 1.5, 3.5].
    # Spearman = Pearson of the ranks: deviations from 3.5 give cov 5, variances 16 and 16.5.
    # Kendall tau-b: 7 concordant, 3 discordant pairs, 3 tied in old only, 2 tied in new only:
    # (7 - 3) / sqrt((7 + 3 + 3)(7 + 3 + 2)).
    # Within groups: step 1 orders 1 of its 3 pairs alike, step 2 all 3: 4 of 6.
    # |new - old| = 2, 0, 2.5, 3, 1, 1.5: mean 10 / 6.
    summary = rescore.summary
    assert summary["spearman"] == pytest.approx(5 / math.sqrt(16 * 16.5), abs=1e-6)
    assert summary["kendall_tau"] == pytest.approx(4 / math.sqrt(13 * 12), abs=1e-6)
    assert summary["pair_agreement"] == pytest.approx(4 / 6, abs=1e-6)
    assert summary["group_pairs"] == 6
    assert summary["mean_abs_diff"] == pytest.approx(10 / 6, abs=1e-6)
    assert (summary["trajectories"], summary["paired"], summary["errors"]) == (6, 6, 0)
    assert summary["curve"]["steps"] == [1, 2]
    assert summary["curve"]["old"] == pytest.approx([0.5, 0.5])
    assert summary["curve"]["new"] == pytest.approx([2.0, 7 / 3])
    # Rank gaps |new rank - old rank|: 2, 4, 1.5, 0.5, 0, 0; on a tie the larger |new - old| first.
    order = [(d["step"], d["old_reward"], d["new_reward"], d["rank_gap"]) for d in summary["disagreements"]]
    assert order == [
        (1, 1.0, 1.0, 4.0),
        (1, 0.0, 2.0, 2.0),
        (1, 0.5, 3.0, 1.5),
        (2, 1.0, 4.0, 0.5),
        (2, 0.5, 2.0, 0.0),
        (2, 0.0, 1.0, 0.0),
    ]
    listed = [
        (s.step, s.trajectory.index) for s in rescores.rescore_scores(rescore=rescore).select_related("trajectory")
    ]
    assert listed == [(1, 1), (1, 0), (1, 2), (2, 0), (2, 2), (2, 1)]

    assert training_state(small_run) == before  # training untouched: steps, checkpoints, rewards, metrics
    assert list(small_run.events.filter(kind="rescore").values_list("message", flat=True))[-1].startswith(
        f"Re-score #{rescore.id} done: 6 trajectories, Spearman 0.308"
    )


def test_it_records_errors_in_the_reward_per_trajectory(alice, small_run):
    broken = new_reward(
        alice,
        """def reward(trajectory, scenario):
    text = trajectory.messages()[-1]["content"]
    if text == "a":
        raise ValueError("cannot score a one-letter answer")
    return 1.0
""",
    )
    rescore = rescore_create(user=alice, run=small_run, reward_version=broken)
    rescore_execute(rescore_id=rescore.id)
    rescore.refresh_from_db()
    assert rescore.status == "done"
    rows = list(RescoreScore.objects.filter(rescore=rescore).select_related("trajectory"))
    failed = [r for r in rows if r.error]
    assert len(failed) == 2 and all(r.new_reward is None for r in failed)
    assert all("ValueError: cannot score a one-letter answer" in r.error and "reward.py" in r.error for r in failed)
    assert {r.trajectory.messages[-1]["content"] for r in failed} == {"a"}
    assert all(r.new_reward == 1.0 for r in rows if not r.error)
    assert rescore.summary["errors"] == 2 and rescore.summary["paired"] == 4


def test_a_reward_that_does_not_load_fails_every_trajectory_with_the_reason(alice, small_run):
    rescore = rescore_create(user=alice, run=small_run, reward_version=new_reward(alice, "def reward(:\n"))
    rescore_execute(rescore_id=rescore.id)
    rescore.refresh_from_db()
    assert rescore.status == "done" and rescore.summary["errors"] == 6 and rescore.summary["spearman"] is None
    assert all(
        e.startswith("Loading your code failed:") and "SyntaxError: invalid syntax" in e
        for e in RescoreScore.objects.filter(rescore=rescore).values_list("error", flat=True)
    )


def test_a_group_reward_scores_each_stored_group_together(alice, small_run):
    # Rank within the group, 0 for the shortest answer: only a per-group score can give this.
    by_rank = new_reward(
        alice,
        """def score_group(group, scenario):
    lengths = [len(t.messages()[-1]["content"]) for t in group]
    return [float(sorted(lengths).index(n)) for n in lengths]
""",
        kind="group",
    )
    rescore = rescore_create(user=alice, run=small_run, reward_version=by_rank)
    rescore_execute(rescore_id=rescore.id)
    rescore.refresh_from_db()
    rows = list(
        RescoreScore.objects.filter(rescore=rescore)
        .order_by("step", "trajectory__index")
        .values_list("step", "new_reward")
    )
    assert rows == [(1, 1.0), (1, 0.0), (1, 2.0), (2, 2.0), (2, 0.0), (2, 1.0)]
    assert rescore.summary["pair_agreement"] == pytest.approx(4 / 6)


def test_a_twenty_step_run_with_a_changed_reward_finishes_and_shows_its_agreement(alice, monkeypatch):
    """20 seeded steps of stored trajectories (2 groups of 4 a step), re-scored in several batches."""
    monkeypatch.setattr(rescores, "BATCH_TRAJECTORIES", 48)  # 6 steps a batch: 4 sandbox batches
    run = seed_run(alice, steps_done=20)
    words = ["a", "bb", "ccc", "dddd"]
    for step in range(1, 21):
        for g in range(2):
            # The run's reward grew over the steps; the answers are the same lengths every step.
            seed_group(run, step, [(round(step / 20 * (i + 1) / 4, 4), words[(i + g) % 4]) for i in range(4)])
    before = training_state(run)
    rescore = rescore_create(user=alice, run=run, reward_version=new_reward(alice))
    rescore_execute(rescore_id=rescore.id)
    rescore.refresh_from_db()
    assert rescore.status == "done", rescore.error
    assert (rescore.trajectories_total, rescore.trajectories_done) == (160, 160)
    summary = rescore.summary
    assert summary["curve"]["steps"] == list(range(1, 21))
    assert summary["curve"]["new"] == [2.5] * 20  # (1 + 2 + 3 + 4) / 4 at every step
    assert summary["curve"]["old"] == pytest.approx([step / 20 * 2.5 / 4 for step in range(1, 21)], abs=1e-4)
    # Group 0 is ordered alike by both (6 of 6 pairs); group 1's shift makes 3 of its 6 pairs agree.
    assert summary["pair_agreement"] == pytest.approx(9 / 12)
    assert -1 <= summary["spearman"] <= 1 and -1 <= summary["kendall_tau"] <= 1
    assert len(summary["disagreements"]) == rescores.DISAGREEMENTS_KEPT
    assert training_state(run) == before


def test_a_running_run_is_rescored_as_stored_when_the_job_starts_and_a_later_one_takes_more(alice):
    run = seed_run(alice, steps_done=1)
    run.status = "running"
    run.save()
    seed_group(run, 1, [(0.0, "a"), (1.0, "bb")])
    first = rescore_create(user=alice, run=run, reward_version=new_reward(alice))
    rescore_execute(rescore_id=first.id)
    # The run goes on: step 2 is committed.
    seed_group(run, 2, [(0.0, "ccc"), (1.0, "dddd")])
    run.steps_done = 2
    run.save()
    first.refresh_from_db()
    assert first.trajectories_done == 2 and first.summary["curve"]["steps"] == [1]
    later = rescore_create(user=alice, run=run, reward_version=first.reward_version)
    rescore_execute(rescore_id=later.id)
    later.refresh_from_db()
    assert later.trajectories_done == 4 and later.summary["curve"]["steps"] == [1, 2]


def test_a_redelivered_task_repeats_nothing(alice, small_run, monkeypatch):
    rescore = rescore_create(user=alice, run=small_run, reward_version=new_reward(alice))
    rescore_execute(rescore_id=rescore.id)
    calls = []
    monkeypatch.setattr("training.analytics.rescores.run_scores", lambda request: calls.append(request))
    rescore_execute(rescore_id=rescore.id)  # done: left alone
    Rescore.objects.filter(id=rescore.id).update(status="running")  # as if its worker died after the last batch
    rescore_execute(rescore_id=rescore.id)
    assert calls == []  # every trajectory was already scored: no sandbox started
    assert RescoreScore.objects.filter(rescore=rescore).count() == 6


def test_it_refuses_with_a_message_that_says_what_to_fix(alice, bob, small_run):
    reward = new_reward(alice)
    with pytest.raises(ApplicationError, match="not yours"):
        rescore_create(user=bob, run=small_run, reward_version=new_reward(bob))
    with pytest.raises(ApplicationError, match="reward function is not yours"):
        rescore_create(user=alice, run=small_run, reward_version=new_reward(bob))
    with pytest.raises(ApplicationError, match="a reward function version, or RULER"):
        rescore_create(user=alice, run=small_run)
    with pytest.raises(ApplicationError, match="one of the two"):
        rescore_create(user=alice, run=small_run, reward_version=reward, use_ruler=True)
    with pytest.raises(ApplicationError, match="needs a judge endpoint"):
        rescore_create(user=alice, run=small_run, use_ruler=True, ruler_judge="")
    with pytest.raises(ApplicationError, match="names no judge"):
        rescore_create(user=alice, run=small_run, use_ruler=True, ruler_judge="endpoint:nope")
    with pytest.raises(ApplicationError, match="split must be one of train, validation"):
        rescore_create(user=alice, run=small_run, reward_version=reward, split="test")
    with pytest.raises(ApplicationError, match="no stored validation trajectories .* choose the train split"):
        rescore_create(user=alice, run=small_run, reward_version=reward, split="validation")
    empty = seed_run(alice, steps_done=0)
    with pytest.raises(ApplicationError, match="Nothing to re-score yet.*Wait for its first step"):
        rescore_create(user=alice, run=empty, reward_version=reward)
    assert not Rescore.objects.exists()


def test_a_sandbox_that_cannot_be_jailed_fails_the_rescore_with_the_reason(alice, small_run, monkeypatch):
    from rollouts.sandbox.jail import JailUnavailable

    def unavailable(request):
        raise JailUnavailable("bubblewrap (bwrap) is not installed")

    monkeypatch.setattr("training.analytics.rescores.run_scores", unavailable)
    rescore = rescore_create(user=alice, run=small_run, reward_version=new_reward(alice))
    rescore_execute(rescore_id=rescore.id)
    rescore.refresh_from_db()
    assert rescore.status == "failed" and "bubblewrap (bwrap) is not installed" in rescore.error
    assert small_run.events.filter(kind="rescore", data__level="warning").exists()


def test_the_sweep_sends_the_message_owed_to_a_queued_rescore(alice, small_run, monkeypatch):
    from datetime import timedelta

    from django.utils import timezone

    from training import sweeper

    sent = []
    monkeypatch.setattr(sweeper, "publish", lambda task_name, args=(), **kw: sent.append((task_name, args)) or True)
    rescore = rescore_create(user=alice, run=small_run, reward_version=new_reward(alice))
    Rescore.objects.filter(id=rescore.id).update(created_at=timezone.now() - timedelta(minutes=1))
    assert sweeper.dispatch_owed()["rescores"] == [rescore.id]
    assert ("training.tasks.rescore_execute_task", (rescore.id,)) in sent
    assert Rescore.objects.get(id=rescore.id).dispatched_at is not None
    assert sweeper.dispatch_owed()["rescores"] == []  # sent once


def test_ruler_rescores_each_group_through_a_judge_endpoint_with_the_users_key(alice, small_run, settings):
    """The judge is a server with known answers (tests.rollouts.sandbox.fake_judge): no model could be relied
    on for known scores. It is reached from the jail through the worker's proxy, which adds the stored key."""
    from tests.egress import egress_allow
    from tests.rollouts.sandbox.fake_judge import FakeJudge
    from training.services.judges import judge_endpoint_create

    key = "sk-user-judge-key-0042"
    with FakeJudge([0.2, 0.9, 0.5]) as judge:
        egress_allow(settings, judge.base_url)  # as an operator would allow a private judge
        judge_endpoint_create(owner=alice, name="ext", base_url=judge.base_url, model="judge-model", api_key=key)
        rescore = rescore_create(user=alice, run=small_run, use_ruler=True, ruler_judge="endpoint:ext")
        rescore_execute(rescore_id=rescore.id)
    rescore.refresh_from_db()
    assert rescore.status == "done", rescore.error
    # One request per stored group, the three trajectories side by side, with the user's key added outside.
    assert judge.trajectory_counts() == [3, 3]
    assert [(r["body"]["model"], r["authorization"]) for r in judge.requests] == [("judge-model", f"Bearer {key}")] * 2
    rows = list(RescoreScore.objects.filter(rescore=rescore).order_by("step", "trajectory__index"))
    assert [r.new_reward for r in rows] == [0.2, 0.9, 0.5] * 2
    assert rows[0].metrics["ruler_explanation"] == "judged 1 of 3"


def test_nul_characters_from_the_reward_are_dropped_not_the_score(alice, small_run):
    # PostgreSQL refuses NUL in text and jsonb: a reward that puts some in its metrics or error still gets stored.
    nul = new_reward(
        alice,
        """def reward(trajectory, scenario):
    trajectory.metrics["note\\x00"] = "a\\x00b"
    if trajectory.messages()[-1]["content"] == "a":
        raise ValueError("bad\\x00answer")
    return 1.0
""",
    )
    rescore = rescore_create(user=alice, run=small_run, reward_version=nul)
    rescore_execute(rescore_id=rescore.id)
    rescore.refresh_from_db()
    assert rescore.status == "done", rescore.error
    rows = list(RescoreScore.objects.filter(rescore=rescore))
    assert all(r.metrics["note"] == "ab" for r in rows)
    assert (
        sorted(r.error.splitlines()[0] for r in rows if r.error)
        == ["The reward function failed: ValueError: badanswer"] * 2
    )


def test_a_reward_reads_the_stored_additional_histories_as_in_the_step(alice):
    """A re-score rebuilds each trajectory as the reward function saw it in the step: its additional
    histories (ART's) come back too, their sampled turns as Choice objects."""
    run = seed_run(alice, steps_done=1)
    group = seed_group(run, 1, [(0.0, "main"), (0.0, "other")])
    first = group.trajectories.order_by("index").first()
    first.additional_histories = [{"messages": answer("from a second agent"), "tools": None}]
    first.save(update_fields=["additional_histories"])
    reads_histories = new_reward(
        alice,
        """def reward(trajectory, scenario):
    texts = [h.messages_and_choices[-1].message.content for h in trajectory.additional_histories]
    return float(sum(len(t) for t in texts))
""",
    )
    rescore = rescore_create(user=alice, run=run, reward_version=reads_histories)
    rescore_execute(rescore_id=rescore.id)
    rows = dict(RescoreScore.objects.filter(rescore=rescore).values_list("trajectory__index", "new_reward"))
    assert rows == {0: float(len("from a second agent")), 1: 0.0}
