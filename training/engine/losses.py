"""GRPO policy losses on flat tensors of trained tokens.

Every function takes the N trained tokens of a micro-batch as 1-D tensors:
  new_logprobs  [N]  log π_θ(token) under the policy being trained (carries the gradient)
  old_logprobs  [N]  log π_old(token) recorded by the sampler (vLLM) when the rollout was generated
  advantages    [N]  the trajectory's advantage, repeated over its tokens
  seq_ids       [N]  long, index of the token's sequence within the micro-batch (0 .. S-1)
and returns a per-token loss [N] (to be minimised) plus a bool mask [N] of tokens whose ratio was clipped.
Aggregation into a scalar is separate (`aggregate`), so the choice of loss and of token- vs
sequence-level averaging are independent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PolicyLoss:
    per_token: torch.Tensor  # [N] loss of each trained token
    clipped: torch.Tensor  # [N] bool, the clip was active for this token


def cispo_loss(
    new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float
) -> PolicyLoss:
    """CISPO (MiniMax-M1): -sg(clip(r, 1-ε_low, 1+ε_high)) · A · log π_θ.

    The importance weight r = π_θ/π_old is clipped and detached, so it only rescales a REINFORCE
    gradient; unlike PPO no token ever loses its gradient, rare tokens included.
    """
    ratio = torch.exp(new_logprobs - old_logprobs).detach()
    weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    clipped = (ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high)
    return PolicyLoss(per_token=-weight * advantages * new_logprobs, clipped=clipped)


def ppo_loss(
    new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float
) -> PolicyLoss:
    """PPO clipped surrogate: -min(r·A, clip(r, 1-ε_low, 1+ε_high)·A), r = π_θ/π_old per token."""
    ratio = torch.exp(new_logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped_obj = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    # The clip is active (the token's gradient is zero) where the clipped objective is the smaller one.
    clipped = clipped_obj < unclipped
    return PolicyLoss(per_token=-torch.minimum(unclipped, clipped_obj), clipped=clipped)


def gspo_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    seq_ids: torch.Tensor,
    eps_low: float,
    eps_high: float,
) -> PolicyLoss:
    """GSPO: PPO clipping applied to the sequence ratio s_i = exp(mean_t(log π_θ - log π_old)).

    Every token of sequence i carries that sequence's loss -min(s_i·A_i, clip(s_i)·A_i); with
    sequence-level aggregation this is exactly the GSPO objective, one term per sequence.
    """
    n_seqs = int(seq_ids.max().item()) + 1 if seq_ids.numel() else 0
    diff = new_logprobs - old_logprobs  # [N]
    sums = torch.zeros(n_seqs, dtype=diff.dtype, device=diff.device).index_add(0, seq_ids, diff)
    counts = torch.zeros(n_seqs, dtype=diff.dtype, device=diff.device).index_add(0, seq_ids, torch.ones_like(diff))
    seq_ratio = torch.exp(sums / counts.clamp(min=1.0))[seq_ids]  # [N], s_i broadcast to its tokens
    unclipped = seq_ratio * advantages
    clipped_obj = seq_ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    clipped = clipped_obj < unclipped
    return PolicyLoss(per_token=-torch.minimum(unclipped, clipped_obj), clipped=clipped)


def kl_k3(new_logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) for tokens sampled from π_θ: exp(d) - d - 1, d = ref - new.

    Schulman's "k3": unbiased, always ≥ 0, lower variance than the plain log-ratio. [N] -> [N].
    """
    d = ref_logprobs - new_logprobs
    return torch.exp(d) - d - 1.0


def aggregate(
    per_token: torch.Tensor,
    seq_ids: torch.Tensor,
    seq_token_counts: torch.Tensor,
    mode: str,
    total_tokens: int,
    total_seqs: int,
) -> torch.Tensor:
    """This micro-batch's share of the batch loss, a scalar.

    "token":    Σ_tokens loss / total_tokens               (every token of the batch weighs the same)
    "sequence": Σ_tokens loss / |seq| / total_seqs          (mean per sequence, then over sequences)
    seq_token_counts [S] holds each sequence's trained-token count; totals are over the whole update,
    not the micro-batch, so the shares of all micro-batches add up to the full-batch mean and
    accumulated gradients equal the gradient of one big batch.
    """
    if mode == "token":
        return per_token.sum() / max(total_tokens, 1)
    if mode == "sequence":
        weights = 1.0 / seq_token_counts.to(per_token.dtype).clamp(min=1.0)  # [S]
        return (per_token * weights[seq_ids]).sum() / max(total_seqs, 1)
    raise ValueError(f"unknown loss aggregation {mode!r}")


def policy_loss(
    name: str,
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    seq_ids: torch.Tensor,
    eps_low: float,
    eps_high: float,
) -> PolicyLoss:
    """Dispatch on the configured loss name."""
    if name == "cispo":
        return cispo_loss(new_logprobs, old_logprobs, advantages, eps_low, eps_high)
    if name == "ppo":
        return ppo_loss(new_logprobs, old_logprobs, advantages, eps_low, eps_high)
    if name == "gspo":
        return gspo_loss(new_logprobs, old_logprobs, advantages, seq_ids, eps_low, eps_high)
    raise ValueError(f"unknown loss {name!r}")
