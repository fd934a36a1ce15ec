"""The step source of client-driven runs (training.client_runs.source) on rows from factories, and the
completion of sampled turns that came without token ids or log-probs (training.engine.tokenize) with the
default model's real tokenizer and chat template; last, one tiny-model update on a parsed client job."""

from __future__ import annotations

import math

import pytest
import torch
from django.db import transaction

from artweb.testing.factories import RunFactory
from tests.client_runs.test_wire import MB4, VOCAB, body, choice, group, trajectory
from tests.training.engine import conftest as engine_fixtures
from training.client_runs.models import ClientTrainingJob, ClientTrainingJobEvent
from training.client_runs.source import CLIENT_SOURCE
from training.client_runs.wire import parse_training_job
from training.engine.config import TrainConfig
from training.engine.tokenize import complete_sampled_turns, encode_sampled_turn, tokenize_trajectory
from training.engine.trainer import make_trainer
from training.models import Run
from training.services.steps.sources import step_source

# The engine tests' fixtures: the default model's tokenizer, and a tiny random Llama that uses it.
default_model_dir = engine_fixtures.default_model_dir
tokenizer = engine_fixtures.tokenizer
tiny_model_dir = engine_fixtures.tiny_model_dir

Type = ClientTrainingJobEvent.Type


@pytest.fixture
def run(alice):
    return RunFactory(
        owner=alice,
        driver=Run.Driver.CLIENT,
        script_version=None,
        reward_version=None,
        status=Run.Status.QUEUED,
        num_steps=2,
    )


def post(run, *groups, config=None) -> ClientTrainingJob:
    """A training job as client_job_create stores it: the parsed groups, each with one of the run's scenarios."""
    parsed = parse_training_job(body(*groups, config=config), vocab_size=VOCAB, record_bytes=MB4)
    scenarios = list(run.scenario_set.scenarios.order_by("index"))
    return ClientTrainingJob.objects.create(
        run=run,
        groups=[
            {"scenario": s.id, "trajectories": g.trajectories}
            for s, g in zip(scenarios[: len(parsed.groups)], parsed.groups, strict=True)
        ],
        settings=parsed.settings,
        tokens=parsed.tokens,
    )


def events(job) -> list[tuple[str, dict]]:
    return list(job.events.order_by("id").values_list("type", "data"))


# --- the step source -----------------------------------------------------------------------------------


def test_a_client_run_has_the_client_source_and_a_script_run_none(run):
    assert step_source(run) is CLIENT_SOURCE
    assert step_source(RunFactory(owner=run.owner)) is None


def test_take_marks_the_oldest_job_running_and_hands_out_copies(run):
    first = post(run, group(1.0, 0.0), group(0.5, 0.0), config={"learning_rate": 1e-5})
    second = post(run, group(0.0, 1.0))
    assert CLIENT_SOURCE.pending(run)

    posted = CLIENT_SOURCE.take(run, step=1)
    assert posted.key == first.id
    assert dict(ClientTrainingJob.objects.values_list("id", "status")) == {first.id: "running", second.id: "queued"}
    assert [s.id for s in posted.scenarios] == [g["scenario"] for g in first.groups]
    assert [t["reward"] for t in posted.groups[1].trajectories] == [0.5, 0.0]
    assert posted.settings == {"learning_rate": 1e-5}
    assert posted.metrics == {
        "client_turns_sampled": 4.0,
        "client_turns_retokenized": 0.0,
        "client_turns_policy_logprobs": 0.0,
    }

    # The trainer completes turns in place: what the job stores stays as the client posted it.
    turn = posted.groups[0].trajectories[0]["messages"][-1]
    turn["token_ids"], turn["logprobs"] = [5], [0.0]
    posted.groups[0].trajectories[0]["reward"] = 7.0
    first.refresh_from_db()
    stored = first.groups[0]["trajectories"][0]
    assert stored["reward"] == 1.0 and stored["messages"][-1]["logprobs"] == [-0.5, -0.25]
    assert stored["messages"][-1]["token_ids"] == [19, 2]

    again = CLIENT_SOURCE.take(run, step=1)  # a retried attempt: the same job, running, fresh copies
    assert again.key == first.id and again.groups[0].trajectories[0]["messages"][-1]["token_ids"] == [19, 2]
    assert ClientTrainingJob.objects.get(id=first.id).status == "running"


def test_take_with_nothing_pending_gives_none(run):
    done = post(run, group(1.0, 0.0))
    ClientTrainingJob.objects.filter(id=done.id).update(status=ClientTrainingJob.Status.DONE)
    assert not CLIENT_SOURCE.pending(run) and CLIENT_SOURCE.take(run, step=2) is None


def test_started_is_written_once_across_attempts(run):
    job = post(run, group(1.0, 0.0))
    CLIENT_SOURCE.started(CLIENT_SOURCE.take(run, step=1), num_sequences=2)
    CLIENT_SOURCE.started(CLIENT_SOURCE.take(run, step=1), num_sequences=2)  # the step's second attempt
    assert events(job) == [(Type.STARTED, {"num_sequences": 2})]


def test_trained_writes_the_update_figures_the_client_reads(run):
    job = post(run, group(1.0, 0.0))
    posted = CLIENT_SOURCE.take(run, step=1)
    CLIENT_SOURCE.trained(posted, {"loss": 0.5, "grad_norm": 1.5, "tokens_trained": 4.0, "groups_used": 1.0})
    assert events(job) == [(Type.GRADIENT_STEP, {"loss": 0.5, "grad_norm": 1.5, "tokens_trained": 4.0})]


def test_committed_in_the_steps_transaction_marks_the_job_done_with_training_ended(run):
    job = post(run, group(1.0, 0.0))
    posted = CLIENT_SOURCE.take(run, step=1)
    with transaction.atomic():
        CLIENT_SOURCE.committed(posted, step=1)
    job.refresh_from_db()
    assert job.status == ClientTrainingJob.Status.DONE and job.step == 1 and job.finished_at is not None
    assert events(job) == [(Type.ENDED, {"step": 1})]
    assert not CLIENT_SOURCE.pending(run)


def test_failed_is_written_once_and_never_after_a_commit(run):
    job = post(run, group(1.0, 0.0))
    posted = CLIENT_SOURCE.take(run, step=1)
    CLIENT_SOURCE.failed(posted, "RuntimeError: CUDA out of memory")
    CLIENT_SOURCE.failed(posted, "a second report")
    job.refresh_from_db()
    assert job.status == ClientTrainingJob.Status.FAILED and job.error == "RuntimeError: CUDA out of memory"
    assert events(job) == [(Type.FAILED, {"error_message": "RuntimeError: CUDA out of memory"})]

    done = post(run, group(1.0, 0.0))
    posted = CLIENT_SOURCE.take(run, step=1)
    with transaction.atomic():
        CLIENT_SOURCE.committed(posted, step=1)
    CLIENT_SOURCE.failed(posted, "too late")
    assert ClientTrainingJob.objects.get(id=done.id).status == ClientTrainingJob.Status.DONE
    assert [t for t, _ in events(done)] == [Type.ENDED]


# --- completing turns that came without ids or log-probs -----------------------------------------------

CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "It is 4.", "sampled": True},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "6", "sampled": True},
]


def test_a_turn_without_ids_gets_the_templates_ids_up_to_the_eos_token(tokenizer):
    for index in (2, 4):
        ids = encode_sampled_turn(tokenizer, CONVERSATION, index, None)
        assert ids[-1] == tokenizer.eos_token_id and ids.count(tokenizer.eos_token_id) == 1
        assert tokenizer.decode(ids) == CONVERSATION[index]["content"] + tokenizer.eos_token
        # What the sampler would have drawn after the generation prompt the server rendered.
        prompt = tokenizer.apply_chat_template(CONVERSATION[:index], tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(CONVERSATION[: index + 1], tokenize=False)
        full_ids = tokenizer.encode(full, add_special_tokens=False)
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        assert full_ids[: len(prompt_ids) + len(ids)] == prompt_ids + ids


def test_a_template_that_does_not_render_the_prompt_as_a_prefix_gets_the_content_and_eos(default_model_dir):
    from transformers import AutoTokenizer

    odd = AutoTokenizer.from_pretrained(default_model_dir)
    # The generation prompt is not how the template writes an assistant turn's start.
    odd.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}Reply:{% endif %}"
    )
    ids = encode_sampled_turn(odd, CONVERSATION, 2, None)
    assert ids == odd.encode("It is 4.", add_special_tokens=False) + [odd.eos_token_id]


class PolicyStandIn:
    """Stands in for GRPOTrainer's forward pass (checks the splice, not the model): `.logprobs(trajs)` gives
    -0.01, -0.02, ... for each trainable token of each trajectory as the real trainer tokenizes it (cut
    to max_seq_len), and records what it was asked for."""

    def __init__(self, tokenizer, max_seq_len: int = 4096):
        self.tokenizer, self.max_seq_len, self.asked = tokenizer, max_seq_len, []

    def logprobs(self, trajectories):
        self.asked.append(trajectories)
        out = []
        for t in trajectories:
            seq = tokenize_trajectory(self.tokenizer, t, self.max_seq_len)
            out.append([-(k + 1) / 100 for k in range(seq.n_trainable)])
        return out


def mixed_trajectory(tokenizer) -> dict:
    """Three sampled turns: one without ids, one complete from the sampler, one with ids but no logprobs."""
    messages = [dict(m) for m in CONVERSATION]
    complete = tokenizer.encode("Sure.", add_special_tokens=False) + [tokenizer.eos_token_id]
    messages[2:2] = [
        {"role": "assistant", "content": "Sure.", "sampled": True, "token_ids": complete, "logprobs": [-0.7] * 3},
        {"role": "user", "content": "Go on."},
    ]
    messages[-1]["sampled_token_ids"] = tokenizer.encode("6", add_special_tokens=False) + [tokenizer.eos_token_id]
    return {"messages": messages, "tools": None, "reward": 1.0}


def test_policy_logprobs_land_on_each_completed_turn_in_order(tokenizer):
    traj = mixed_trajectory(tokenizer)
    assert len(traj["messages"][2]["token_ids"]) == 3  # "Sure." + eos, as the stand-in's sums assume
    untouched = {"messages": [dict(m) for m in traj["messages"][:4]], "tools": None, "reward": 0.0}
    policy = PolicyStandIn(tokenizer)

    assert complete_sampled_turns(policy, [[traj, untouched]]) == 2
    assert policy.asked == [[traj]]  # only trajectories with a turn to complete, once each
    sure, four, six = traj["messages"][2], traj["messages"][4], traj["messages"][6]
    assert four["token_ids"] == encode_sampled_turn(tokenizer, traj["messages"], 4, None)  # the template's
    assert tokenizer.decode(four["token_ids"]) == "It is 4." + tokenizer.eos_token
    assert six["token_ids"] == tokenizer.encode("6", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert "sampled_token_ids" not in six and not any("_fill" in m for m in traj["messages"])
    n4, n6 = len(four["token_ids"]), len(six["token_ids"])
    values = [-(k + 1) / 100 for k in range(3 + n4 + n6)]
    assert sure["logprobs"] == [-0.7] * 3  # the sampler's, kept; its tokens still count in the positions
    assert four["logprobs"] == values[3 : 3 + n4]
    assert six["logprobs"] == values[3 + n4 :]
    assert untouched["messages"][2]["logprobs"] == [-0.7] * 3


def test_a_truncated_tail_gets_zero_logprobs(tokenizer):
    traj = mixed_trajectory(tokenizer)
    whole = PolicyStandIn(tokenizer)
    complete_sampled_turns(whole, [[mixed_trajectory(tokenizer)]])
    length = len(tokenize_trajectory(tokenizer, whole.asked[0][0], 4096).input_ids)

    complete_sampled_turns(PolicyStandIn(tokenizer, max_seq_len=length - 2), [[traj]])
    last = traj["messages"][-1]
    assert last["logprobs"][-2:] == [0.0, 0.0]  # past max_seq_len: never trained, padded
    assert all(v < 0 for v in last["logprobs"][:-2])
    assert len(last["logprobs"]) == len(last["token_ids"])


# --- one update on a client's job ----------------------------------------------------------------------


def lora(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


@pytest.mark.slow  # about 4 s on two cores: the model loads and runs three forward passes and a backward
def test_a_client_job_without_ids_or_logprobs_trains_the_tiny_model(tiny_model_dir, tokenizer):
    def client_group(prompt, *answers):
        return {"trajectories": [trajectory(r, choice(a), prompt=prompt) for a, r in answers]}

    job = parse_training_job(
        body(
            client_group("2+2?", ("4", 1.0), ("5", 0.0), ("four", 1.0)),
            client_group("Capital of France?", ("Paris", 1.0), ("Rome", 0.0)),
            config={"learning_rate": 1e-2},
        ),
        vocab_size=VOCAB,
        record_bytes=MB4,
    )
    assert job.tokens["client_turns_retokenized"] == 5
    cfg = TrainConfig(max_grad_norm=1.0, weight_decay=0.0, dtype="float32")
    trainer = make_trainer(cfg, base_model_path=str(tiny_model_dir), device="cpu")
    trainer.load(None)
    trainer.apply_step_settings(job.settings)
    groups = [g.trajectories for g in job.groups]

    assert complete_sampled_turns(trainer, groups) == 5
    turns = [t["messages"][-1] for g in groups for t in g]
    assert all(t["token_ids"][-1] == tokenizer.eos_token_id for t in turns)
    # The policy's own log-probs (the update's ratio starts at 1), each turn's sampled token its own.
    trajs = [t for g in groups for t in g]
    for traj, values in zip(trajs, trainer.logprobs(trajs), strict=True):
        assert traj["messages"][-1]["logprobs"] == pytest.approx(values, abs=1e-5)
        assert all(v < 0 for v in values) and len(set(values)) > 1
    before = lora(trainer)
    metrics = trainer.train_step(groups)

    assert math.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0 and metrics["learning_rate"] == 1e-2
    assert metrics["tokens_trained"] == sum(len(t["token_ids"]) for t in turns)
    after = lora(trainer)
    assert any("lora_B" in n and not torch.equal(before[n], after[n]) for n in before)
    trainer.close()
