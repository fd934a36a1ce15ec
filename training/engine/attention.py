"""Attention over packed rows: several sequences in one row, a group's shared prompt in it once.

A packed row is a run of blocks. A block is either a whole sequence (causal attention over itself) or
the part of a sequence after its group's shared prompt, which attends to that prompt's block and,
causally, to itself. No block sees any other, so every token gets exactly the attention it would get
in a row of its own. The linear layers, most of the work, run on the packed tokens only; attention
gathers the blocks into a few batched calls of transformers' SDPA kernel ("buckets" of blocks of
similar width), so its padding stays within a bound instead of rows × longest row.

Sharing the prompt is exact for the loss and its gradient: the prompt's hidden states depend on the
LoRA weights, and keeping them in the graph (never detached) makes the backward pass add every
completion's gradient through them, which is what the per-trajectory computation sums too.

The model reads the layout from the `packed_layout` keyword that the trainer passes to the decoder;
transformers hands model keywords down to the attention function of every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

ATTENTION_NAME = "artweb_packed"


@dataclass(frozen=True)
class Block:
    start: int  # first position of the block in the packed row
    end: int  # one past its last position
    # (start, end) of the shared-prompt block this block continues, or None for a block that stands alone.
    context: tuple[int, int] | None = None


@dataclass
class Bucket:
    """Blocks attended to in one batched SDPA call: each block a batch row, padded to the bucket's
    widest queries (Q) and keys (K). Padded query rows are computed and dropped, never read."""

    query_index: torch.Tensor  # [n, Q] long, row position of each block's queries (padding: 0)
    key_index: torch.Tensor  # [n, K] long, row positions of its keys: its prompt's, then its own
    mask: torch.Tensor  # [n, 1, Q, K] bool, True where query i may see key j


@dataclass
class PackedLayout:
    """The blocks of one packed row, in order and covering it, and the batched calls that attend them."""

    blocks: list[Block]
    buckets: list[Bucket] = field(default_factory=list)
    # [T] long: for each row position, where its output lies in the buckets' outputs laid end to end.
    output_index: torch.Tensor | None = None

    @classmethod
    def build(cls, blocks: list[Block], device: torch.device | str) -> PackedLayout:
        order = sorted(range(len(blocks)), key=lambda i: (-_keys(blocks[i]), i))
        buckets, output_index, offset = [], np.zeros(max((b.end for b in blocks), default=0), np.int64), 0
        for members in _bucket(order, blocks):
            q_max = max(blocks[i].end - blocks[i].start for i in members)
            k_max = max(_keys(blocks[i]) for i in members)
            q_index = np.zeros((len(members), q_max), np.int64)
            k_index = np.zeros((len(members), k_max), np.int64)
            mask = np.zeros((len(members), 1, q_max, k_max), np.bool_)
            for row, i in enumerate(members):
                b = blocks[i]
                n, (cs, ce) = b.end - b.start, b.context or (0, 0)
                c = ce - cs
                q_index[row, :n] = np.arange(b.start, b.end)
                k_index[row, : c + n] = np.concatenate([np.arange(cs, ce), np.arange(b.start, b.end)])
                # Query i sees the c prompt keys and its own keys 0..i: j <= i + c. A padded query row
                # (i >= n) sees the same real keys as the last real one, so its softmax stays finite.
                i_idx = np.minimum(np.arange(q_max), n - 1)[:, None]
                mask[row, 0] = np.arange(k_max)[None, :] <= i_idx + c
                output_index[b.start : b.end] = offset + row * q_max + np.arange(n)
            offset += len(members) * q_max
            to = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
            buckets.append(Bucket(to(q_index), to(k_index), to(mask)))
        return cls(blocks=blocks, buckets=buckets, output_index=torch.from_numpy(output_index).to(device))

    @property
    def widest(self) -> int:
        """Keys of the widest attention call: what the kernel choice depends on."""
        return max((b.key_index.shape[1] for b in self.buckets), default=0)


def _keys(b: Block) -> int:
    return b.end - b.start + (b.context[1] - b.context[0] if b.context else 0)


def _bucket(order: list[int], blocks: list[Block], waste: float = 2.0) -> list[list[int]]:
    """Blocks (widest first) cut into buckets whose padded attention (n × Q × K) stays within `waste`
    times the work of the blocks alone (Σ queries × keys); few calls, little padding."""
    buckets: list[list[int]] = []
    real = q_max = k_max = 0
    for i in order:
        b = blocks[i]
        n, k = b.end - b.start, _keys(b)
        if buckets:
            q2, k2 = max(q_max, n), max(k_max, k)
            if (len(buckets[-1]) + 1) * q2 * k2 <= waste * (real + n * k):
                buckets[-1].append(i)
                real, q_max, k_max = real + n * k, q2, k2
                continue
        buckets.append([i])
        real, q_max, k_max = n * k, n, k
    return buckets


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    packed_layout: PackedLayout | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [1, H, T, D], key/value [1, Hkv, T, D] →
    ([1, T, H, D], None). Without a layout (a plain forward) it is transformers' SDPA attention."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if packed_layout is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if query.shape[0] != 1:
        raise ValueError(f"a packed layout describes one row, got a batch of {query.shape[0]}")
    q, k, v = query[0], key[0], value[0]  # [H, T, D], [Hkv, T, D]
    # With a mask, transformers repeats each key/value head for the query heads that share it (GPU
    # kernels with a mask lack grouped heads). The CPU kernel takes the groups as they are: the repeated
    # copies were 250 MB of the 1.7 GB a CPU update keeps for its backward pass (SmolLM2: 3 key/value
    # heads for 9 query heads), and the call is a fifth faster without them.
    gqa = q.device.type == "cpu" and k.shape[0] != q.shape[0]
    outputs = []
    for bucket in packed_layout.buckets:
        n, q_len = bucket.query_index.shape
        k_len = bucket.key_index.shape[1]
        # Gather each block's queries and keys into a batch row: [n, H, Q, D] and [n, Hkv, K, D].
        qb = q.index_select(1, bucket.query_index.flatten()).view(q.shape[0], n, q_len, -1).transpose(0, 1)
        kb = k.index_select(1, bucket.key_index.flatten()).view(k.shape[0], n, k_len, -1).transpose(0, 1)
        vb = v.index_select(1, bucket.key_index.flatten()).view(v.shape[0], n, k_len, -1).transpose(0, 1)
        if gqa:
            out = torch.nn.functional.scaled_dot_product_attention(
                qb, kb, vb, attn_mask=bucket.mask, dropout_p=dropout, scale=scaling, enable_gqa=True
            ).transpose(1, 2)
        else:
            out, _ = sdpa_attention_forward(
                module, qb, kb, vb, bucket.mask, dropout=dropout, scaling=scaling, is_causal=False
            )
        outputs.append(out.reshape(n * q_len, *out.shape[2:]))  # [n·Q, H, D]
    return torch.cat(outputs).index_select(0, packed_layout.output_index)[None], None


def use_packed_attention(model: Any) -> bool:
    """Switch a transformers model (or a PEFT model over one) to `packed_attention`; False, and nothing
    changed, for a model whose layers do not take their attention from transformers' registry.

    Registered without a mask function, so transformers builds no [T, T] mask for packed rows; a forward
    without a layout therefore must have no padding (the trainer only runs packed rows through it).
    """
    from transformers import AttentionInterface

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "_supports_attention_backend", False):
        return False
    AttentionInterface.register(ATTENTION_NAME, packed_attention)
    base.set_attn_implementation(ATTENTION_NAME)
    return True
