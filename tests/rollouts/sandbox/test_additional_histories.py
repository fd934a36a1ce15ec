"""ART's additional histories and rollouts that return several trajectories, from the sandbox's `art` to the
stored rows: the record the guest builds, the worker's checks of it (caps and shapes), how a scenario's
rollouts split into GRPO groups, and scripts run in the real jailed sandbox whose results are stored."""

import asyncio
import json
import sys
from pathlib import Path

import pytest

from artweb.testing.factories import RunFactory
from rollouts.sandbox.records import (
    MAX_ADDITIONAL_HISTORIES,
    MAX_TRAJECTORIES_PER_ROLLOUT,
    RecordError,
    check_trajectory,
    scored_groups,
)
from rollouts.sandbox.rollouts import run_rollouts
from training.models import Trajectory, TrajectoryGroup
from training.services.steps.groups import groups_persist, reward_stats

GUEST = Path(__file__).resolve().parents[3] / "rollouts" / "sandbox" / "guest"
if str(GUEST) not in sys.path:
    sys.path.insert(0, str(GUEST))

import art  # noqa: E402 - the sandbox's `art`
from _artweb_runner.results import returned_trajectories, rollout_record, settle_others  # noqa: E402

VOCAB = 1000


def sampled(text: str, ids: list[int], logprob: float = -0.5):
    """A Choice as the inference server returns it to a script: its sampled token ids and their logprobs."""
    from openai.types.chat.chat_completion import Choice

    return Choice.model_validate(
        {
            "index": 0,
            "finish_reason": "stop",
            "token_ids": ids,
            "message": {"role": "assistant", "content": text},
            "logprobs": {
                "content": [{"token": "t", "logprob": logprob, "bytes": None, "top_logprobs": []} for _ in ids]
            },
        }
    )


# --- the sandbox's art ---------------------------------------------------------------------------------


def test_it_records_each_additional_history_with_its_sampled_tokens_and_tools():
    tools = [{"type": "function", "function": {"name": "look", "parameters": {}}}]
    trajectory = art.Trajectory(
        messages_and_choices=[{"role": "user", "content": "main"}, sampled("ok", [1, 2])],
        additional_histories=[art.History([{"role": "user", "content": "aside"}, sampled("sure", [3])], tools)],
        reward=1.0,
    )
    trajectory.additional_histories.append({"messages_and_choices": [{"role": "user", "content": "late"}]})

    record = trajectory.to_record()
    assert record["messages"][1]["token_ids"] == [1, 2]
    assert record["additional_histories"] == [
        {
            "messages": [
                {"role": "user", "content": "aside"},
                {"role": "assistant", "content": "sure", "token_ids": [3], "logprobs": [-0.5], "finish_reason": "stop"},
            ],
            "tools": tools,
        },
        {"messages": [{"role": "user", "content": "late"}], "tools": None},
    ]
    assert (
        check_trajectory(
            {**record, "error": None, "duration_ms": 1, "prompt_tokens": 0, "completion_tokens": 3}, vocab_size=VOCAB
        )["additional_histories"]
        == record["additional_histories"]
    )
    assert "additional_histories" not in art.Trajectory(reward=1.0).to_record()  # none: the record as before


def test_a_rollout_may_return_a_trajectory_a_list_of_them_or_a_group():
    x, o = art.Trajectory(reward=1.0), art.Trajectory(reward=0.0)

    async def pending():
        return o

    async def main():
        assert await returned_trajectories(x) == ([x], "by_position")
        assert await returned_trajectories([x, o]) == ([x, o], "by_position")
        assert await returned_trajectories((x, o)) == ([x, o], "by_position")
        assert await returned_trajectories(art.TrajectoryGroup([x, pending()])) == ([x, o], "one_group")
        for bad, message in (
            ({"reward": 1}, "must return an art.Trajectory, a list of them .* not dict"),
            ([x, "o"], "returned str among its trajectories"),
            ([], "returned no trajectories"),
        ):
            with pytest.raises((TypeError, ValueError), match=message):
                await returned_trajectories(bad)

    asyncio.run(main())


def test_a_rollouts_record_holds_its_other_trajectories_unless_it_failed():
    x, o = art.Trajectory(reward=1.0, metadata={"role": "x"}), art.Trajectory(reward=0.0, metadata={"role": "o"})
    assert "more_trajectories" not in rollout_record([x], "by_position")

    record = rollout_record([x, o], "by_position")
    record.update(error=None, duration_ms=40, prompt_tokens=5, completion_tokens=7)
    settle_others(record)
    [other] = record["more_trajectories"]
    assert record["metadata"] == {"role": "x"} and record["grouping"] == "by_position"
    assert other["metadata"] == {"role": "o"} and other["reward"] == 0.0
    assert (other["error"], other["duration_ms"], other["prompt_tokens"], other["completion_tokens"]) == (
        None,
        40,
        0,
        0,
    )

    failed = rollout_record([x, o], "one_group")
    failed.update(error="boom", duration_ms=1, prompt_tokens=0, completion_tokens=0)
    settle_others(failed)
    assert "more_trajectories" not in failed and "grouping" not in failed


def test_a_stored_trajectory_is_rebuilt_for_a_rescore_with_its_additional_histories():
    from _artweb_runner.scoring import restore_trajectory

    turn = {"role": "assistant", "content": "sure", "token_ids": [3], "logprobs": [-0.5], "finish_reason": "stop"}
    aside = history({"role": "user", "content": "aside"}, turn)
    stored = {"messages": [{"role": "user", "content": "main"}], "additional_histories": [aside]}
    trajectory = restore_trajectory(stored)
    [rebuilt] = trajectory.additional_histories
    assert rebuilt.messages_and_choices[1].token_ids == [3]  # a choice again, as the reward function saw it
    assert trajectory.to_record()["additional_histories"] == stored["additional_histories"]


# --- the worker's checks -------------------------------------------------------------------------------


def record(reward=1.0, **fields) -> dict:
    return {
        "messages": [{"role": "user", "content": "hi"}],
        "tools": None,
        "reward": reward,
        "metrics": {},
        "metadata": {},
        "logs": [],
        "error": None,
        "duration_ms": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        **fields,
    }


def history(*messages) -> dict:
    return {"messages": list(messages) or [{"role": "user", "content": "aside"}], "tools": None}


def test_the_worker_keeps_histories_and_other_trajectories_within_their_caps():
    turn = {"role": "assistant", "content": "a", "token_ids": [5], "logprobs": [-0.1]}
    kept = check_trajectory(
        record(
            additional_histories=[history(turn)] * MAX_ADDITIONAL_HISTORIES,
            more_trajectories=[record(0.0)] * (MAX_TRAJECTORIES_PER_ROLLOUT - 1),
            grouping="by_position",
        ),
        vocab_size=VOCAB,
    )
    assert len(kept["additional_histories"]) == MAX_ADDITIONAL_HISTORIES
    assert len(kept["more_trajectories"]) == MAX_TRAJECTORIES_PER_ROLLOUT - 1

    with pytest.raises(RecordError, match=f"{MAX_ADDITIONAL_HISTORIES + 1} additional_histories; at most"):
        check_trajectory(record(additional_histories=[history()] * (MAX_ADDITIONAL_HISTORIES + 1)), vocab_size=VOCAB)
    too_many = record(more_trajectories=[record()] * MAX_TRAJECTORIES_PER_ROLLOUT, grouping="by_position")
    with pytest.raises(RecordError, match=f"returned {MAX_TRAJECTORIES_PER_ROLLOUT + 1} trajectories; at most"):
        check_trajectory(too_many, vocab_size=VOCAB)


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"additional_histories": {"messages": []}}, "additional_histories must be a list"),
        ({"additional_histories": ["hi"]}, 'additional history 0: must be an object with only "messages"'),
        ({"additional_histories": [{**history(), "reward": 1}]}, 'must be an object with only "messages" and "tools"'),
        ({"additional_histories": [{"tools": None}]}, "additional history 0: messages must be a list"),
        ({"additional_histories": [history({"content": "x"})]}, "additional history 0: message 0 must be an object"),
        (
            {"additional_histories": [history({"role": "assistant", "token_ids": [VOCAB], "logprobs": [-1.0]})]},
            r"additional history 0: message 0: a token id must be an integer in \[0, 1000\)",
        ),
        (
            {"additional_histories": [history(), history({"role": "assistant", "token_ids": [1], "logprobs": []})]},
            "additional history 1: message 0: token_ids and logprobs must be lists of the same length",
        ),
        ({"additional_histories": [{**history(), "tools": "look"}]}, "additional history 0: tools must be a list"),
        ({"more_trajectories": record(), "grouping": "by_position"}, "more_trajectories must be a list"),
        ({"more_trajectories": [record()], "grouping": "by_role"}, "with a grouping of by_position or one_group"),
        ({"more_trajectories": [record()]}, "with a grouping of"),
        (
            {
                "more_trajectories": [{**record(), "more_trajectories": [], "grouping": "one_group"}],
                "grouping": "one_group",
            },
            "trajectory 1 of the rollout must be a trajectory object without others of its own",
        ),
        (
            {"more_trajectories": [record(messages="hi")], "grouping": "by_position"},
            "trajectory 1 of the rollout: messages must be a list",
        ),
        (
            {"more_trajectories": [record(error="mine")], "grouping": "by_position"},
            "trajectory 1 of the rollout has an error of its own",
        ),
    ],
)
def test_the_worker_refuses_a_bad_shape_saying_where(fields, expected):
    with pytest.raises(RecordError, match=expected):
        check_trajectory(record(**fields), vocab_size=VOCAB)


def test_a_scenarios_rollouts_split_into_groups_by_role_or_by_game():
    one = [record(1.0), record(0.0)]
    assert scored_groups(one) == [one]

    # Self-play: each rollout returned [x, o]; the x's are one group, the o's another. A failed rollout keeps
    # only its first record, in the first group, whatever it returned.
    games = [
        record(1.0, metadata={"x": 0}, more_trajectories=[record(0.0, metadata={"o": 0})], grouping="by_position"),
        record(0.0, metadata={"x": 1}, more_trajectories=[record(1.0, metadata={"o": 1})], grouping="by_position"),
        record(None, error="boom", more_trajectories=[record(1.0)], grouping="by_position"),
    ]
    xs, os_ = scored_groups(games)
    assert [t["metadata"] for t in xs] == [{"x": 0}, {"x": 1}, {}] and xs[2]["error"] == "boom"
    assert [t["metadata"] for t in os_] == [{"o": 0}, {"o": 1}]
    assert all("more_trajectories" not in t and "grouping" not in t for t in xs)
    assert "more_trajectories" in games[0]  # the records themselves are left as they came

    # A TrajectoryGroup per game: each game is a group of its own.
    duels = [
        record(1.0, more_trajectories=[record(0.0)], grouping="one_group"),
        record(0.5, more_trajectories=[record(0.5)], grouping="one_group"),
    ]
    assert [[t["reward"] for t in g] for g in scored_groups(duels)] == [[1.0, 0.0], [0.5, 0.5]]


# --- in the sandbox, into the stored rows --------------------------------------------------------------

SAMPLED = """
import itertools
from openai.types.chat.chat_completion import Choice

counter = itertools.count()


def sampled(text, ids):
    return Choice.model_validate({
        "index": 0, "finish_reason": "stop", "token_ids": ids, "message": {"role": "assistant", "content": text},
        "logprobs": {"content": [{"token": "t", "logprob": -0.25, "bytes": None, "top_logprobs": []} for _ in ids]},
    })
"""

WITH_HISTORIES = (
    SAMPLED
    + """
import art


async def rollout(model, scenario):
    n = next(counter)
    planner = art.History([{"role": "user", "content": "plan for " + scenario.prompt}, sampled("step one", [11, 12])])
    return art.Trajectory(
        messages_and_choices=[{"role": "user", "content": scenario.prompt}, sampled("w", [7])],
        additional_histories=[planner, {"messages_and_choices": [{"role": "user", "content": "note " + str(n)}]}],
        reward=float(n % 2),
    )
"""
)


def persisted(alice, script, request_for, *, group_size=2, reward=None):
    """The script's batch run in the jailed sandbox on two of a run's scenarios, its groups stored."""
    run = RunFactory(owner=alice, worker="w")
    scenarios = list(run.scenario_set.scenarios.filter(split="train").order_by("index")[:2])
    results = run_rollouts(
        request_for(
            script, scenarios=[s.data for s in scenarios], group_size=group_size, reward=reward, vocab_size=VOCAB
        )
    )
    return results, groups_persist(run, 1, "train", scenarios, results, me="w")


def test_a_scripts_additional_histories_are_stored_with_their_sampled_tokens(alice, request_for):
    results, groups = persisted(alice, WITH_HISTORIES, request_for)
    assert [t["error"] for g in results for t in g.trajectories] == [None] * 4

    assert len(groups) == 2
    rows = list(Trajectory.objects.filter(group__in=groups).order_by("group_id", "index"))
    assert len(rows) == 4
    for row in rows:
        planner, note = row.additional_histories
        assert planner["messages"][0]["content"].startswith("plan for Say the word w")
        assert planner["messages"][1] == {
            "role": "assistant",
            "content": "step one",
            "token_ids": [11, 12],
            "logprobs": [-0.25, -0.25],
            "finish_reason": "stop",
        }
        assert note["messages"][0]["content"].startswith("note ") and note["tools"] is None
        assert row.messages[1]["token_ids"] == [7]
        assert "step one" in row.search_text  # the inspector's search finds a history's text
    assert sum(g.stored_bytes for g in groups) == sum(len(json.dumps(t)) for r in results for t in r.trajectories)


SELF_PLAY = (
    SAMPLED
    + """
import art


async def rollout(model, scenario):
    n = next(counter)
    x = art.Trajectory(messages_and_choices=[{"role": "user", "content": "you are x"}, sampled("x", [1])], reward=n % 2)
    o = art.Trajectory(messages_and_choices=[{"role": "user", "content": "you are o"}, sampled("o", [2])],
                       reward=1 - n % 2, metadata={"role": "o"})
    return [x, o]
"""
)


def test_a_rollout_returning_one_trajectory_per_role_stores_a_group_per_role(alice, request_for):
    results, groups = persisted(alice, SELF_PLAY, request_for, group_size=3)

    for result in results:
        assert [t["error"] for t in result.trajectories] == [None] * 3
        assert all(len(t["more_trajectories"]) == 1 for t in result.trajectories)
    assert len(groups) == 4  # 2 scenarios x 2 roles, each role's group the 3 rollouts of its scenario
    assert [g.scenario_id for g in groups] == [groups[0].scenario_id] * 2 + [groups[2].scenario_id] * 2
    for group, role in zip(groups, ["you are x", "you are o"] * 2, strict=True):
        rows = list(group.trajectories.order_by("index"))
        assert [t.index for t in rows] == [0, 1, 2]
        assert {t.messages[0]["content"] for t in rows} == {role}
        assert group.reward_mean == pytest.approx(sum(t.reward for t in rows) / 3)
    stats = reward_stats(results)
    assert (stats["groups"], stats["rollouts"], stats["rollout_errors"]) == (4, 12, 0)


ONE_GAME = """
import art


async def rollout(model, scenario):
    return art.TrajectoryGroup([art.Trajectory(reward=1.0), art.Trajectory(reward=0.0), art.Trajectory(reward=0.5)])
"""


def test_a_rollout_returning_a_trajectory_group_is_a_group_of_its_own(alice, request_for):
    results, groups = persisted(alice, ONE_GAME, request_for, group_size=2)
    assert len(groups) == 4  # 2 scenarios x 2 games
    assert [sorted(t.reward for t in g.trajectories.all()) for g in groups] == [[0.0, 0.5, 1.0]] * 4
    assert TrajectoryGroup.objects.filter(id__in=[g.id for g in groups], skipped=False).count() == 4


ROLES = """
import art


async def rollout(model, scenario):
    return [art.Trajectory(metadata={"role": role}) for role in ("x", "o")]
"""


def test_a_per_trajectory_reward_function_scores_every_trajectory_a_rollout_returns(request_for):
    reward = 'def reward(trajectory, scenario):\n    return 1.0 if trajectory.metadata["role"] == "x" else 0.0\n'
    for result in run_rollouts(request_for(ROLES, reward=reward)):
        for t in result.trajectories:
            assert t["error"] is None and t["reward"] == 1.0
            assert [o["reward"] for o in t["more_trajectories"]] == [0.0]


def test_a_group_reward_or_a_missing_reward_fails_a_rollout_that_returned_several_saying_what_to_do(request_for):
    score_group = "def score_group(group, scenario):\n    return [1.0 for _ in group]\n"
    for result in run_rollouts(request_for(ROLES, reward=score_group)):
        for t in result.trajectories:
            assert t["reward"] is None and "more_trajectories" not in t
            assert t["error"].startswith("rollout() returned 2 trajectories (a list or a TrajectoryGroup), and a ")
            assert "use a per-trajectory reward function" in t["error"]
    for result in run_rollouts(request_for(ROLES)):
        for t in result.trajectories:
            assert t["error"] == (
                "The rollout set no trajectory.reward (trajectory 0 of the 2 it returned) and no reward function "
                "is attached."
            )


def test_a_trajectory_with_more_histories_than_the_cap_fails_its_own_rollout_naming_the_cap(request_for):
    script = f"""
import art

async def rollout(model, scenario):
    histories = [art.History([{{"role": "user", "content": "h"}}]) for _ in range({MAX_ADDITIONAL_HISTORIES} + scenario.i)]
    return art.Trajectory(reward=1.0, additional_histories=histories)
"""
    over, within = run_rollouts(request_for(script, scenarios=[{"i": 1}, {"i": 0}]))
    for t in over.trajectories:
        assert t["reward"] is None and t["error"] == (
            f"The sandbox sent an invalid trajectory: the trajectory has {MAX_ADDITIONAL_HISTORIES + 1} "
            f"additional_histories; at most {MAX_ADDITIONAL_HISTORIES} are kept (MAX_ADDITIONAL_HISTORIES): put "
            "fewer conversations in one trajectory."
        )
    assert [len(t["additional_histories"]) for t in within.trajectories] == [MAX_ADDITIONAL_HISTORIES] * 2
