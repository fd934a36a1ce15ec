"""Micro-batches: sequences grouped under a token budget and padded into tensors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from training.engine.tokenize import TokenizedSequence


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [B, T] long, right-padded
    attention_mask: torch.Tensor  # [B, T] long, 1 on real tokens
    # Targets are the tokens at positions 1..T-1, predicted from positions 0..T-2.
    target_mask: torch.Tensor  # [B, T-1] bool, the target token was sampled by the policy
    targets: torch.Tensor  # [N] long, the trained tokens, row-major over target_mask
    old_logprobs: torch.Tensor  # [N] float32
    advantages: torch.Tensor  # [N] float32, each token's trajectory advantage
    seq_ids: torch.Tensor  # [N] long, row of each trained token (0 .. B-1)
    seq_token_counts: torch.Tensor  # [B] trained tokens per row
    unpadded: bool  # every row has the full width (attention_mask is all ones)

    @property
    def n_tokens(self) -> int:
        return int(self.targets.numel())


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
    """Pad a list of sequences into one MicroBatch on device.

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
    target_mask = trainable[:, 1:]
    rows = np.broadcast_to(np.arange(len(seqs))[:, None], target_mask.shape)
    to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    return MicroBatch(
        input_ids=to(ids),
        attention_mask=to(attn),
        target_mask=to(target_mask),
        targets=to(ids[:, 1:][target_mask]),
        old_logprobs=to(old[:, 1:][target_mask]),
        advantages=to(adv[:, 1:][target_mask]),
        seq_ids=to(rows[target_mask]),
        seq_token_counts=to(target_mask.sum(axis=1)),
        unpadded=bool(attn.all()),
    )
