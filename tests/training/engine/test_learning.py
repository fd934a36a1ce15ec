"""The default model learns: after two GRPO updates a rewarded answer is likelier, and more so than a
punished one."""

import math

import pytest

from training.engine.config import TrainConfig
from training.engine.trainer import make_trainer

from .conftest import trajectory

PROMPT = "Capital of France? One word."
ANSWERS = {"Paris": 1.0, "London": 0.0}


@pytest.mark.slow  # two real updates of the default model
def test_it_moves_the_policy_toward_rewarded_answers(default_model_dir, tokenizer):
    cfg = TrainConfig(learning_rate=3e-4, max_grad_norm=1.0, weight_decay=0.0)
    trainer = make_trainer(cfg, base_model_path=str(default_model_dir), device="cpu")
    trainer.load(None)
    group = [trajectory(tokenizer, PROMPT, answer, reward) for answer, reward in ANSWERS.items()]
    # On-policy, as in a run: the sampler's log-probs are the current policy's. The second update
    # reuses them, slightly stale, which the clipped importance weight accounts for.
    before = trainer.logprobs(group)
    for traj, values in zip(group, before, strict=False):
        traj["messages"][-1]["logprobs"] = values
    first = trainer.train_step([group])
    trainer.train_step([group])
    after = trainer.logprobs(group)
    trainer.close()

    assert first["sampler_kl"] < 1e-6 and first["optimizer_stepped"] == 1
    # Summed log-prob of each answer (its tokens and <|im_end|>).
    paris, london = [(sum(b), sum(a)) for b, a in zip(before, after, strict=False)]
    assert paris[1] > paris[0] + 0.5, (paris, london)
    # Both answers share the prompt and the one-word shape, so the punished one may rise a little with
    # the rewarded one; what GRPO must do is widen the gap between them.
    assert paris[1] - london[1] > paris[0] - london[0] + 0.5, (paris, london)


def test_a_step_with_no_signal_reports_no_token_means(default_model_dir, tokenizer):
    """Every answer rewarded alike: no advantage, no trained token, so no entropy, clip fraction or sampler
    KL (NaN, which a step's record leaves out) rather than zeros that read as a collapsed policy."""
    trainer = make_trainer(TrainConfig(), base_model_path=str(default_model_dir), device="cpu")
    trainer.load(None)
    group = [trajectory(tokenizer, PROMPT, answer, 1.0) for answer in ANSWERS]
    out = trainer.train_step([group])
    trainer.close()
    assert out["tokens_trained"] == 0
    for name in ("entropy", "policy_clip_fraction", "sampler_kl"):
        assert math.isnan(out[name]), (name, out[name])
