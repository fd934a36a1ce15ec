"""Training a trajectory's additional histories as ART does: each history its own sequence, carrying the
trajectory's advantage, its sampled turns spliced in as the main history's are. So one update on a trajectory
with a history equals the update on its histories as separate trajectories of that advantage. Also: what an
ART client posts with additional histories, and rollouts that returned several trajectories (one per role),
trained in a group per role. Tiny random-weight model, real tokenizer and chat template."""

import math

import pytest
import torch

from rollouts.sandbox.records import scored_groups
from tests.client_runs.test_wire import MB4, VOCAB, body, choice, group
from tests.training.engine.conftest import completion
from training.client_runs.wire import parse_training_job
from training.engine.advantages import compute_advantages
from training.engine.config import TrainConfig
from training.engine.tokenize import complete_sampled_turns, tokenize_trajectory
from training.engine.trainer import make_trainer

# fp32 and no clipping: the comparisons below are of raw gradients, which must agree to rounding.
EXACT = {"learning_rate": 1e-2, "max_grad_norm": 0.0, "weight_decay": 0.0, "dtype": "float32"}


def conversation(tokenizer, prompt: str, answer: str, reward=None, logprob: float = -2.0) -> dict:
    return {
        "messages": [{"role": "user", "content": prompt}, completion(tokenizer, answer, logprob)],
        "tools": None,
        "reward": reward,
    }


@pytest.fixture
def with_history(tokenizer) -> dict:
    """The main conversation and a planner's beside it, one rollout, one reward."""
    main = conversation(tokenizer, "What is 2+2?", "4", reward=1.0)
    planner = conversation(tokenizer, "Plan how to answer 2+2.", "Add the numbers.", logprob=-3.0)
    return {**main, "additional_histories": [{"messages": planner["messages"], "tools": None}]}


@pytest.fixture
def loser(tokenizer) -> dict:
    return conversation(tokenizer, "What is 2+2?", "5", reward=0.0, logprob=-1.0)


def trainer_for(tiny_model_dir, **cfg):
    trainer = make_trainer(TrainConfig(**EXACT, **cfg), base_model_path=str(tiny_model_dir), device="cpu")
    trainer.load(None)
    return trainer


def update(trainer, groups) -> tuple[dict, list[torch.Tensor]]:
    """One train_step's metrics and the gradients the optimizer stepped with."""
    grads: list[torch.Tensor] = []

    def keep(optimizer, _args, _kwargs):
        grads.extend(p.grad.detach().clone() for g in optimizer.param_groups for p in g["params"])

    handle = trainer.optimizer.register_step_pre_hook(keep)
    try:
        return trainer.train_step(groups), grads
    finally:
        handle.remove()


def test_a_trajectory_with_one_additional_history_gives_two_sequences_with_its_advantage(
    tiny_model_dir, tokenizer, with_history, loser
):
    trainer = trainer_for(tiny_model_dir)
    groups = [[with_history, loser]]
    adv = compute_advantages(groups)
    seqs = trainer.tokenize_groups(groups, adv.values, adv.used)

    assert [s.source for s in seqs] == [(0, 0), (0, 0), (0, 1)]
    assert seqs[0].advantage == seqs[1].advantage == adv.values[0][0] == pytest.approx(1.0, abs=1e-5)
    planner = with_history["additional_histories"][0]
    alone = tokenize_trajectory(tokenizer, planner, 4096)
    assert seqs[1].input_ids == alone.input_ids and seqs[1].trainable == alone.trainable
    sampled = planner["messages"][1]["token_ids"]
    assert [t for t, keep in zip(seqs[1].input_ids, seqs[1].trainable, strict=True) if keep] == sampled
    assert [lp for lp, keep in zip(seqs[1].old_logprobs, seqs[1].trainable, strict=True) if keep] == [-3.0] * len(
        sampled
    )
    trainer.close()


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_its_update_equals_its_histories_trained_as_separate_trajectories_of_equal_advantage(
    tiny_model_dir, tokenizer, with_history, loser, aggregation
):
    planner = with_history["additional_histories"][0]
    main = {k: v for k, v in with_history.items() if k != "additional_histories"}
    # The planner as a trajectory of its own, in a second group where it gets the same advantage, +1: its
    # partner's reward is 0 and it has no sampled turn, so it trains nothing.
    silent = {"messages": [{"role": "user", "content": "..."}], "tools": None, "reward": 0.0}
    separate = [[main, loser], [{**planner, "reward": 1.0}, silent]]

    together_metrics, together = update(
        trainer_for(tiny_model_dir, loss_aggregation=aggregation), [[with_history, loser]]
    )
    apart_metrics, apart = update(trainer_for(tiny_model_dir, loss_aggregation=aggregation), separate)

    assert together_metrics["advantages"][0][0] == pytest.approx(apart_metrics["advantages"][1][0])
    assert together_metrics["tokens_trained"] == apart_metrics["tokens_trained"]
    assert together_metrics["trajectories_trained"] == 2 and apart_metrics["trajectories_trained"] == 3
    assert math.isfinite(together_metrics["loss"])
    assert together_metrics["loss"] == pytest.approx(apart_metrics["loss"], rel=1e-5, abs=1e-7)
    assert len(together) == len(apart) and any(g.abs().sum() > 0 for g in together)
    for a, b in zip(together, apart, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)

    # The comparison can tell: without its history, the trajectory's update is another one.
    _, main_only = update(trainer_for(tiny_model_dir, loss_aggregation=aggregation), [[main, loser]])
    assert any(not torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(together, main_only, strict=True))


def test_a_client_posts_additional_histories_and_their_turns_are_completed_like_the_main_ones(
    tiny_model_dir, tokenizer
):
    posted = group(1.0, 0.0)
    planner = {
        "messages_and_choices": [
            {"role": "user", "content": "Plan how to answer 2+2."},
            choice("Add the numbers.", [19, 2, 7], [-0.5, -0.25, -0.125]),
            {"role": "user", "content": "And then?"},
            choice("Say it."),  # no ids, no logprobs: the worker completes this turn
        ],
        "tools": None,
    }
    posted["trajectories"][0]["additional_histories"] = [planner]
    job = parse_training_job(body(posted, group(0.5, 0.0)), vocab_size=VOCAB, record_bytes=MB4)

    record = job.groups[0].trajectories[0]
    [history] = record["additional_histories"]
    assert history["tools"] is None and [m["role"] for m in history["messages"]] == ["user", "assistant"] * 2
    first, second = history["messages"][1], history["messages"][3]
    assert first["sampled"] and first["token_ids"] == [19, 2, 7] and first["logprobs"] == [-0.5, -0.25, -0.125]
    assert second["sampled"] and "token_ids" not in second
    assert record["completion_tokens"] == 2 + 3  # the main turn's sampled ids and the history's
    assert job.tokens == {"client_turns_sampled": 5, "client_turns_retokenized": 1, "client_turns_policy_logprobs": 1}

    trainer = trainer_for(tiny_model_dir)
    assert complete_sampled_turns(trainer, [g.trajectories for g in job.groups]) == 1
    assert second["token_ids"][-1] == tokenizer.eos_token_id
    [values] = trainer.logprobs([history])
    assert first["logprobs"] == [-0.5, -0.25, -0.125]  # the sampler's, kept
    assert second["logprobs"] == pytest.approx(values[3:], abs=1e-5)  # the policy's, after the first turn's
    trainer.close()


def test_a_job_whose_only_sampled_turns_are_in_additional_histories_is_accepted():
    posted = group(1.0, 0.0)
    for t in posted["trajectories"]:
        t["messages_and_choices"] = [{"role": "user", "content": "2+2?"}]
        t["additional_histories"] = [{"messages_and_choices": [choice("4", [19, 2], [-0.5, -0.25])], "tools": None}]
    job = parse_training_job(body(posted), vocab_size=VOCAB, record_bytes=MB4)
    assert [t["additional_histories"][0]["messages"][0]["token_ids"] for t in job.groups[0].trajectories] == [
        [19, 2],
        [19, 2],
    ]


def test_rollouts_that_returned_one_trajectory_per_role_train_a_group_per_role(tiny_model_dir, tokenizer):
    def game(x_reward: float) -> dict:
        x = conversation(tokenizer, "You are x.", "x wins" if x_reward else "x loses", reward=x_reward)
        o = {**conversation(tokenizer, "You are o.", "o", reward=1.0 - x_reward), "error": None}
        return {**x, "error": None, "more_trajectories": [o], "grouping": "by_position"}

    scenario = [game(1.0), game(0.0), game(1.0)]
    metrics = update(trainer_for(tiny_model_dir), [scenario])[0]

    # x's rewards [1, 0, 1] and o's [0, 1, 0]: two groups, each normalised against its own role's mean.
    xs, os_ = metrics["advantages"]
    assert xs == pytest.approx([0.7071, -1.4142, 0.7071], abs=1e-3)
    assert os_ == pytest.approx([-0.7071, 1.4142, -0.7071], abs=1e-3)
    assert metrics["groups_used"] == 2 and metrics["trajectories_trained"] == 6
    assert [len(g) for g in scored_groups(scenario)] == [3, 3]
