"""Packed micro-batches: the layout on hand-made sequences, and on a tiny model the same log-probs, loss
and gradients as padded rows, with each group's prompt run once."""

import pytest
import torch

from training.engine.attention import Block, PackedLayout
from training.engine.batching import common_prefix_length, pack, plan_packed
from training.engine.config import ConfigError, TrainConfig
from training.engine.tokenize import TokenizedSequence
from training.engine.trainer import make_trainer

from .conftest import completion

# fp32 and no dropout: packed and padded runs are compared for equality, not for similarity.
EXACT = {"learning_rate": 1e-2, "max_grad_norm": 1.0, "weight_decay": 0.0, "dtype": "float32", "lora_dropout": 0.0}


def seq(ids: list[int], trainable_from: int, advantage: float = 1.0) -> TokenizedSequence:
    """A sequence whose tokens from index trainable_from on were sampled (old log-prob -0.5 each)."""
    trainable = [i >= trainable_from for i in range(len(ids))]
    return TokenizedSequence(
        input_ids=ids, trainable=trainable, old_logprobs=[-0.5 if t else 0.0 for t in trainable], advantage=advantage
    )


# --- layout, on hand-made sequences -------------------------------------------------------------------
def test_common_prefix_length_is_the_longest_prefix_all_share():
    assert common_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]]) == 2
    assert common_prefix_length([[1, 2], [1, 2, 3]]) == 2  # one sequence is a prefix of the other
    assert common_prefix_length([[1, 2], [3, 2]]) == 0
    assert common_prefix_length([[1, 2, 3]]) == 0  # nothing to share alone


def test_it_packs_a_groups_prompt_once_and_restarts_positions_per_sequence():
    seqs = [seq([1, 2, 3, 4, 5], 3, advantage=1.0), seq([1, 2, 3, 6], 3, advantage=-1.0), seq([7, 8, 9], 2, 0.5)]
    mb = pack(seqs, keys=["a", "a", "b"], device="cpu")

    # Group a's prompt [1, 2, 3] once, then each rest; group b's lone sequence stands alone.
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 0, 1, 2]]
    assert mb.attention_mask is None and mb.tokens_processed == 9
    assert mb.layout.blocks == [Block(0, 3), Block(3, 5, (0, 3)), Block(5, 6, (0, 3)), Block(6, 9)]
    # Token 4 (position 3) is predicted from the prompt's last state (row 2), token 5 from row 3; the
    # second sequence's token 6 also from row 2: the shared state serves both sequences.
    assert mb.targets.tolist() == [4, 5, 6, 9]
    assert mb.hidden_index.tolist() == [2, 3, 2, 7]
    assert mb.seq_ids.tolist() == [0, 0, 1, 2] and mb.seq_token_counts.tolist() == [2, 1, 1]
    assert mb.advantages.tolist() == [1.0, 1.0, -1.0, 0.5] and mb.old_logprobs.tolist() == [-0.5] * 4
    assert mb.attention_width == 5  # the widest attention call: 3 prompt keys + the first rest's 2


def test_a_continuing_block_sees_all_of_its_prompt_and_its_own_past():
    layout = PackedLayout.build([Block(0, 2), Block(2, 5, (0, 2))], device="cpu")
    (bucket,) = layout.buckets  # both blocks in one batched call, the wider first
    assert bucket.query_index.tolist() == [[2, 3, 4], [0, 1, 0]]  # the prompt's queries padded to 3
    assert bucket.key_index.tolist() == [[0, 1, 2, 3, 4], [0, 1, 0, 0, 0]]
    assert bucket.mask[:, 0].int().tolist() == [
        [
            [1, 1, 1, 0, 0],  # prompt keys, then its own up to i
            [1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1],
        ],
        [
            [1, 0, 0, 0, 0],  # the prompt alone: causal
            [1, 1, 0, 0, 0],
            [1, 1, 0, 0, 0],
        ],
    ]  # a padded query row, dropped
    # Row positions 0, 1 are the prompt's outputs (bucket row 1), 2..4 the rest's (bucket row 0).
    assert layout.output_index.tolist() == [3, 4, 0, 1, 2]
    assert layout.widest == 5


def test_blocks_of_very_different_widths_go_to_separate_calls():
    long, short = Block(0, 64), Block(64, 68)
    layout = PackedLayout.build([long, short, Block(68, 72), Block(72, 75)], device="cpu")
    # A call's padded work stays within twice its blocks' own: one short block may ride with the long
    # one (2 × 64² ≤ 2 × (64² + 4²)), a second would not; the rest share a narrow call.
    assert [tuple(b.key_index.shape) for b in layout.buckets] == [(2, 64), (2, 4)]


def test_on_a_cpu_keys_and_values_are_kept_once_per_head_they_have():
    """Grouped heads (9 query heads reading 3 key/value heads, as in the default model) go to the CPU kernel
    as they are: what the backward pass keeps holds each key/value head once, not once per query head
    that reads it, and the answer is the repeated heads' answer."""
    from transformers.integrations.sdpa_attention import repeat_kv

    from training.engine.attention import packed_attention

    layout = PackedLayout.build([Block(0, 4), Block(4, 7, (0, 4)), Block(7, 9, (0, 4))], device="cpu")
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 3, True
    torch.manual_seed(0)
    query = torch.randn(1, 9, 9, 8, requires_grad=True)
    key, value = torch.randn(1, 3, 9, 8, requires_grad=True), torch.randn(1, 3, 9, 8, requires_grad=True)
    kept: list[torch.Size] = []

    def keep(tensor):
        kept.append(tensor.shape)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        out, _ = packed_attention(module, query, key, value, None, scaling=8**-0.5, packed_layout=layout)
    keys_kept = [shape for shape in kept if len(shape) == 4 and shape[2] == layout.widest]
    assert keys_kept and all(shape[1] == 3 for shape in keys_kept), kept

    module.num_key_value_groups = 1  # the same heads, repeated by hand
    repeated, _ = packed_attention(
        module, query, repeat_kv(key, 3), repeat_kv(value, 3), None, scaling=8**-0.5, packed_layout=layout
    )
    torch.testing.assert_close(out, repeated)


def test_the_planner_counts_a_shared_prompt_once_per_micro_batch():
    # Prompt of 10 shared by the three sequences of group 0; each has 5 tokens of its own.
    group = [seq(list(range(10)) + [100 + k] * 5, 10) for k in range(3)]
    other = seq([50] * 12, 6)
    # 15 + 5 + 5 = 25 fit in 25; the 12-token sequence starts the next micro-batch.
    assert plan_packed(group + [other], [0, 0, 0, 1], token_budget=25) == [[0, 1, 2], [3]]
    # In 20, the third sequence opens a micro-batch and pays the prompt again (15); 15 + 12 > 20.
    assert plan_packed(group + [other], [0, 0, 0, 1], token_budget=20) == [[0, 1], [2], [3]]
    # A sequence longer than the budget goes alone.
    assert plan_packed([seq([1] * 30, 1), seq([2] * 4, 1)], [0, 1], token_budget=16) == [[0], [1]]


# --- the same update as padded rows, on a tiny model --------------------------------------------------
def two_turns(tokenizer, prompt: str, first: str, second: str, reward: float) -> dict:
    """An agent trajectory: two sampled turns with a user message between them."""
    return {
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": prompt},
            completion(tokenizer, first, -1.2),
            {"role": "user", "content": "Are you sure?"},
            completion(tokenizer, second, -0.7),
        ],
        "tools": None,
        "reward": reward,
    }


@pytest.fixture
def groups(tokenizer, make_trajectory):
    return [
        [
            make_trajectory("2+2?", "4", 1.0, -0.4),
            make_trajectory("2+2?", "5", 0.0, -2.0),
            make_trajectory("2+2?", "four, since two and two make four", 1.0, -1.1),
            make_trajectory("2+2?", "4", 0.5, -0.4),
        ],  # identical tokens to the first: all of it is shared
        [
            two_turns(tokenizer, "Capital of France?", "Paris", "Yes, Paris.", 1.0),
            two_turns(tokenizer, "Capital of France?", "Rome", "No, Paris.", 0.2),
            two_turns(tokenizer, "Capital of France?", "Lyon", "Lyon.", 0.0),
        ],
        [make_trajectory("Say hi", "hi", 1.0), make_trajectory("Say hi", "hello there, friend", 0.0)],
    ]


def run_update(tiny_model_dir, cfg, groups, packed):
    """One update; returns its metrics and the gradient of every adapter weight before the optimizer step."""
    trainer = make_trainer(cfg, base_model_path=str(tiny_model_dir), device="cpu", packed=packed)
    trainer.load(None)
    grads = {}

    def keep(optimizer, args, kwargs):
        grads.update(
            {n: p.grad.clone() for n, p in zip(trainer._param_names, optimizer.param_groups[0]["params"], strict=True)}
        )

    trainer.optimizer.register_step_pre_hook(keep)
    metrics = trainer.train_step(groups)
    logprobs = trainer.logprobs([t for g in groups for t in g])
    trainer.close()
    return metrics, grads, logprobs


@pytest.mark.parametrize(
    "cfg",
    [
        TrainConfig(**EXACT),
        TrainConfig(**EXACT, loss="ppo", loss_aggregation="sequence"),
        TrainConfig(**EXACT, loss="gspo", loss_aggregation="sequence", kl_beta=0.1),
        # Groups split over micro-batches, each paying its prompt again; layers recomputed in the backward.
        TrainConfig(**EXACT, micro_batch_tokens=28, gradient_checkpointing=True),
    ],
    ids=["cispo-token", "ppo-sequence", "gspo-kl", "small-micro-batches-checkpointed"],
)
def test_a_packed_update_equals_the_padded_update(tiny_model_dir, groups, cfg):
    """The prompt's hidden states stay in the graph, so every completion's gradient flows back through
    the LoRA weights of the shared prompt as it does through each padded row's own copy."""
    packed, packed_grads, packed_lp = run_update(tiny_model_dir, cfg, groups, packed=True)
    padded, padded_grads, padded_lp = run_update(tiny_model_dir, cfg, groups, packed=False)

    for a, b in zip(packed_lp, padded_lp, strict=True):
        assert len(a) == len(b) > 0
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-5)
    for key in ("loss", "policy_loss", "kl", "sampler_kl", "entropy", "grad_norm", "policy_clip_fraction"):
        assert packed[key] == pytest.approx(padded[key], rel=1e-5, abs=1e-7), key
    assert packed["tokens_trained"] == padded["tokens_trained"] and packed["grad_norm"] > 0
    assert packed_grads.keys() == padded_grads.keys() and packed_grads
    scale = max(g.abs().max() for g in padded_grads.values())
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-4, atol=1e-5 * float(scale))


def test_it_processes_each_groups_prompt_once_and_no_padding(tiny_model_dir, tokenizer, groups):
    trainer = make_trainer(TrainConfig(**EXACT), base_model_path=str(tiny_model_dir), device="cpu")
    trainer.load(None)
    metrics = trainer.train_step(groups)
    seqs = [
        s for s in trainer.tokenize_groups(groups, metrics["advantages"], [True] * len(groups)) if s.n_trainable > 0
    ]
    expected = 0
    for g in range(len(groups)):
        ids = [s.input_ids for s in seqs if s.source[0] == g]
        shared = common_prefix_length(ids)
        expected += shared + sum(len(i) - shared for i in ids)
    assert metrics["micro_batches"] == 1
    assert metrics["tokens_processed"] == expected < sum(len(s.input_ids) for s in seqs)

    padded = make_trainer(TrainConfig(**EXACT), base_model_path=str(tiny_model_dir), device="cpu", packed=False)
    padded.load(None)
    assert padded.train_step(groups)["tokens_processed"] == len(seqs) * max(len(s.input_ids) for s in seqs)


def test_a_model_without_pluggable_attention_trains_on_padded_rows(tiny_model_dir, groups, monkeypatch):
    from transformers import LlamaForCausalLM

    monkeypatch.setattr(LlamaForCausalLM, "_supports_attention_backend", False)
    trainer = make_trainer(TrainConfig(**EXACT), base_model_path=str(tiny_model_dir), device="cpu")
    trainer.load(None)
    assert trainer.packed is False
    assert trainer.model.get_base_model().config._attn_implementation == "sdpa"
    metrics = trainer.train_step(groups)
    assert metrics["optimizer_stepped"] == 1 and metrics["grad_norm"] > 0


def test_packing_is_refused_for_the_unsloth_backend():
    with pytest.raises(ConfigError, match="peft") as err:
        make_trainer(TrainConfig(backend="unsloth"), base_model_path="unused", packed=True)
    assert err.value.field == "backend"
    assert make_trainer(TrainConfig(backend="unsloth"), base_model_path="unused").packed is False
