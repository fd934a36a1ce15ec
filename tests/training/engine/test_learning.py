"""The default model learns: after a few GRPO updates, a rewarded answer is likelier, a punished one less."""

from training.engine import TrainConfig, make_trainer

from .conftest import trajectory

PROMPT = "What is the capital of France? Answer with one word."
ANSWERS = {"Paris": 1.0, "Lyon": 0.0, "London": 0.0, "Berlin": 0.0}


def test_it_moves_the_policy_toward_rewarded_answers(default_model_dir, tokenizer):
    cfg = TrainConfig(learning_rate=2e-4, max_grad_norm=1.0, weight_decay=0.0)
    trainer = make_trainer(cfg, base_model_path=str(default_model_dir), device="cpu")
    trainer.load(None)
    group = [trajectory(tokenizer, PROMPT, answer, reward) for answer, reward in ANSWERS.items()]

    def logprobs():  # summed log-prob of each answer (its tokens and <|im_end|>) under the current policy
        return [sum(values) for values in trainer.logprobs(group)]

    before = logprobs()
    for _ in range(3):
        # On-policy, as in a real run: the "sampler" log-probs are the current policy's.
        for traj, values in zip(group, trainer.logprobs(group)):
            traj["messages"][-1]["logprobs"] = values
        metrics = trainer.train_step([group])
        assert metrics["optimizer_stepped"] == 1 and metrics["sampler_kl"] < 1e-4
    after = logprobs()
    trainer.close()

    assert after[0] > before[0] + 0.5, (before, after)  # "Paris" rewarded
    assert all(a < b for a, b in zip(after[1:], before[1:])), (before, after)
