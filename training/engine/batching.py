"""Micro-batches: sequences grouped under a token budget, then packed (or padded) into tensors.

Two layouts feed the same trainer code:
  packed  one row; the sequences side by side, a group's shared prompt once, no padding
          (`plan_packed` + `pack`; attention follows `training.engine.attention`);
  padded  one row per sequence, right-padded to the longest (`plan_micro_batches` + `collate`), for
          backends whose attention cannot read a packed layout (Unsloth patches its own).
Either way the trained tokens come out as flat [N] tensors with, for each, the flat position of the
hidden state that predicts it, so log-probs, losses and their aggregation do not depend on the layout.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np
import torch

from training.engine.attention import Block, PackedLayout
from training.engine.tokenize import TokenizedSequence


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [B, T] long (B = 1 when packed)
    attention_mask: torch.Tensor | None  # [B, T] long, 1 on real tokens; None: no padding
    position_ids: torch.Tensor | None  # [B, T] long; None: 0 .. T-1 in every row
    layout: PackedLayout | None  # the blocks of a packed row; None: each row is one causal sequence
    # Flat index into the [B*T] hidden states of the position predicting each trained token; position
    # p predicts the token at p+1 of its own sequence.
    hidden_index: torch.Tensor  # [N] long
    targets: torch.Tensor  # [N] long, the trained tokens, sequence by sequence, in order
    old_logprobs: torch.Tensor  # [N] float32
    advantages: torch.Tensor  # [N] float32, each token's trajectory advantage
    seq_ids: torch.Tensor  # [N] long, sequence of each trained token within the micro-batch (0 .. S-1)
    seq_token_counts: torch.Tensor  # [S] trained tokens per sequence
    attention_width: int  # keys of the widest attention call (the kernel choice depends on it)

    @property
    def n_tokens(self) -> int:
        return int(self.targets.numel())

    @property
    def tokens_processed(self) -> int:
        """Positions the model runs over, padding and each shared prompt once included."""
        return int(self.input_ids.numel())


# --- padded ------------------------------------------------------------------------------------------
def plan_micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Indices grouped so that rows × longest row ≤ token_budget (a longer sequence goes alone).

    Sorting by length first keeps padding small; the order is deterministic, which exact resume needs.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        # Sorted descending, so the first row of the current batch is its longest.
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= token_budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def collate(seqs: list[TokenizedSequence], pad_id: int, device: torch.device | str) -> MicroBatch:
    """Pad a list of sequences into one MicroBatch on device, a row each.

    Filled in numpy and moved in one copy per tensor: per-row torch indexing costs more than the
    forward pass of a small model.
    """
    width = max(len(s.input_ids) for s in seqs)
    shape = (len(seqs), width)
    ids = np.full(shape, pad_id, dtype=np.int64)
    attn = np.zeros(shape, dtype=np.int64)
    trainable = np.zeros(shape, dtype=np.bool_)
    old = np.zeros(shape, dtype=np.float32)
    adv = np.zeros(shape, dtype=np.float32)
    for row, s in enumerate(seqs):
        n = len(s.input_ids)
        ids[row, :n] = s.input_ids
        attn[row, :n] = 1
        trainable[row, :n] = s.trainable
        old[row, :n] = s.old_logprobs
        adv[row, :n] = s.advantage
    # Position 0 has no prediction before it, so a sampled first token (no prompt at all) can't be
    # trained; chat templates always open with a role header, so this does not happen in practice.
    target_mask = trainable[:, 1:]  # [B, T-1]
    rows, cols = np.nonzero(target_mask)  # row-major: sequence by sequence, in order
    to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    return MicroBatch(
        input_ids=to(ids),
        # Without padding the mask is left out, so attention takes its fused causal kernel.
        attention_mask=None if attn.all() else to(attn),
        position_ids=None,
        layout=None,
        hidden_index=to(rows * width + cols),
        targets=to(ids[rows, cols + 1]),
        old_logprobs=to(old[rows, cols + 1]),
        advantages=to(adv[rows, cols + 1]),
        seq_ids=to(rows),
        seq_token_counts=to(target_mask.sum(axis=1)),
        attention_width=width,
    )


# --- packed ------------------------------------------------------------------------------------------
def common_prefix_length(seqs: list[list[int]]) -> int:
    """Length of the longest token prefix all of seqs share (0 for fewer than two)."""
    if len(seqs) < 2:
        return 0
    first, n = seqs[0], min(len(s) for s in seqs)
    for other in seqs[1:]:
        k = 0
        while k < n and other[k] == first[k]:
            k += 1
        n = k
    return n


def plan_packed(seqs: list[TokenizedSequence], keys: list[Hashable], token_budget: int) -> list[list[int]]:
    """Indices grouped so that each micro-batch packs into at most token_budget positions.

    Sequences of one key (a group) that land in one micro-batch share their common prompt, so each
    after the first costs only its own tokens past it; a sequence longer than the budget goes alone.
    Taken in the given order, which keeps groups together and is deterministic (exact resume needs it).
    """
    shared = {}
    for key in dict.fromkeys(keys):
        shared[key] = common_prefix_length([s.input_ids for s, k in zip(seqs, keys, strict=True) if k == key])
    batches: list[list[int]] = []
    used, seen = 0, set()
    for i, (s, key) in enumerate(zip(seqs, keys, strict=True)):
        cost = len(s.input_ids) - (shared[key] if key in seen else 0)
        if batches and used + cost <= token_budget:
            batches[-1].append(i)
            used += cost
        else:
            batches.append([i])
            used, seen = len(s.input_ids), set()
        seen.add(key)
    return batches


def pack(seqs: list[TokenizedSequence], keys: list[Hashable], device: torch.device | str) -> MicroBatch:
    """Pack sequences into one row: per key, the common prompt once, then each sequence's rest.

    Position ids restart at 0 with each prompt or stand-alone sequence and continue from the prompt's
    length in each sequence's rest, so every token has the position it has in its own sequence.
    """
    units: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        units.setdefault(key, []).append(i)
    ids: list[np.ndarray] = []
    positions: list[np.ndarray] = []
    blocks: list[Block] = []
    where: list[np.ndarray | None] = [None] * len(seqs)  # per sequence: row position of each of its tokens
    cursor = 0

    def put(tokens: np.ndarray, first_position: int, context: tuple[int, int] | None) -> np.ndarray:
        nonlocal cursor
        start, cursor = cursor, cursor + len(tokens)
        ids.append(tokens)
        positions.append(np.arange(first_position, first_position + len(tokens)))
        if len(tokens):
            blocks.append(Block(start, cursor, context))
        return np.arange(start, cursor)

    for members in units.values():
        arrays = [np.asarray(seqs[i].input_ids, dtype=np.int64) for i in members]
        p = common_prefix_length([seqs[i].input_ids for i in members])
        prompt_at = put(arrays[0][:p], 0, None) if p else np.arange(0)
        context = (int(prompt_at[0]), int(prompt_at[-1]) + 1) if p else None
        for i, a in zip(members, arrays, strict=True):
            where[i] = np.concatenate([prompt_at, put(a[p:], p, context)])

    hidden, targets, old, adv, seq_ids, counts = [], [], [], [], [], []
    for n, s in enumerate(seqs):
        # Target j (1 .. L-1, sampled) is predicted by the hidden state at the row position of j-1.
        j = np.flatnonzero(np.asarray(s.trainable[1:], dtype=np.bool_)) + 1
        hidden.append(where[n][j - 1])
        targets.append(np.asarray(s.input_ids, dtype=np.int64)[j])
        old.append(np.asarray(s.old_logprobs, dtype=np.float32)[j])
        adv.append(np.full(len(j), s.advantage, dtype=np.float32))
        seq_ids.append(np.full(len(j), n, dtype=np.int64))
        counts.append(len(j))
    to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    layout = PackedLayout.build(blocks, device)
    return MicroBatch(
        input_ids=to(np.concatenate(ids)[None]),
        attention_mask=None,
        position_ids=to(np.concatenate(positions)[None]),
        layout=layout,
        hidden_index=to(np.concatenate(hidden)),
        targets=to(np.concatenate(targets)),
        old_logprobs=to(np.concatenate(old)),
        advantages=to(np.concatenate(adv)),
        seq_ids=to(np.concatenate(seq_ids)),
        seq_token_counts=to(np.asarray(counts, dtype=np.int64)),
        attention_width=layout.widest,
    )
