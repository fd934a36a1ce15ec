"""Log-probabilities of chosen tokens from hidden states, without keeping [N, vocab] logits alive.

For N trained tokens and a vocabulary V, the logits are N×V floats: 6 GB in fp32 for 30k tokens of a
49k vocabulary, and autograd would keep them (and the softmax) until the backward pass. Here the output
projection runs chunk by chunk in both passes and the backward recomputes each chunk's logits, so memory
holds one chunk at a time; the extra matmul is cheap next to the elementwise work it saves. On a CPU, when
the batch's probabilities fit KEEP_ELEMENTS_CPU, the forward keeps them for the backward instead: there the
recomputed projection is a large share of an update.
"""

from __future__ import annotations

import torch

# Elements of one fp32 logits chunk; rows per chunk = this // vocabulary size. On a GPU large chunks
# (2**28 = 1 GiB) keep kernel launches few; on a CPU small ones (2**24 = 64 MiB) stay in cache: measured on
# 2 cores, 32 x 128 sampled tokens: 225 trained tokens/s with 2**28, 307 with 2**24, and 2 GB less memory.
CHUNK_ELEMENTS = 1 << 28
CHUNK_ELEMENTS_CPU = 1 << 24
# Up to this many fp32 probabilities (256 MiB) a CPU update keeps them from the forward for the backward
# rather than projecting every chunk again. Measured on 2 AVX2 cores, 600 tokens of a 49k vocabulary: this
# layer's backward 0.31-0.37 s kept, 0.70-0.74 s projected again. A GPU recomputes (its matmul is cheap and
# its memory the scarce part), and so does a CPU batch larger than this.
KEEP_ELEMENTS_CPU = 1 << 26


class _TokenLogprobs(torch.autograd.Function):
    """(hidden [N, H], weight [V, H] frozen, targets [N]) → (log p(target) [N], entropy [N]).

    Gradient flows to hidden only; entropy is a metric and carries none.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_rows, with_entropy, keep_probs):
        n = hidden.shape[0]
        logprobs = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.zeros(n, dtype=torch.float32, device=hidden.device)
        kept = torch.empty(n, weight.shape[0], dtype=torch.float32, device=hidden.device) if keep_probs else None
        for start in range(0, n, chunk_rows):
            end = min(start + chunk_rows, n)
            log_p = torch.log_softmax((hidden[start:end] @ weight.T).float(), dim=-1)  # [c, V]
            logprobs[start:end] = log_p.gather(1, targets[start:end, None]).squeeze(1)
            if with_entropy or kept is not None:
                probs = log_p.exp()
                if with_entropy:
                    entropy[start:end] = -(probs * log_p).sum(dim=-1)  # H = -Σ p log p
                if kept is not None:
                    kept[start:end] = probs
        ctx.save_for_backward(hidden, weight, targets, kept)
        ctx.chunk_rows = chunk_rows
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, _grad_entropy):
        hidden, weight, targets, kept = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden)
        for start in range(0, hidden.shape[0], ctx.chunk_rows):
            end = min(start + ctx.chunk_rows, hidden.shape[0])
            g = grad_logprobs[start:end, None].float()  # [c, 1]
            if kept is not None:
                scaled = kept[start:end] * -g  # a new tensor: the kept ones stay as they were
            else:
                scaled = torch.softmax((hidden[start:end] @ weight.T).float(), dim=-1).mul_(-g)  # [c, V]
            # d log p(t) / d logits = onehot(t) - softmax(logits)
            grad_logits = scaled.scatter_add_(1, targets[start:end, None], g)
            grad_hidden[start:end] = grad_logits.to(weight.dtype) @ weight
        return grad_hidden, None, None, None, None, None


def token_logprobs(
    hidden: torch.Tensor, output_layer: torch.nn.Module, targets: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(targets) [N] (fp32, differentiable w.r.t. hidden [N, H]) and entropy [N] or None.

    Uses the chunked path for a plain frozen linear output layer (the usual, possibly tied, lm_head);
    anything else (a bias, a trainable or wrapped head) takes the direct path through the module.
    """
    weight = getattr(output_layer, "weight", None)
    plain = (
        type(output_layer) is torch.nn.Linear
        and output_layer.bias is None
        and weight is not None
        and not weight.requires_grad
        and weight.device == hidden.device
    )
    if not plain:
        log_p = torch.log_softmax(output_layer(hidden).float(), dim=-1)  # [N, V]
        lp = log_p.gather(1, targets[:, None]).squeeze(1)
        ent = -(log_p.detach().exp() * log_p.detach()).sum(dim=-1) if with_entropy else None
        return lp, ent
    budget = CHUNK_ELEMENTS if hidden.is_cuda else CHUNK_ELEMENTS_CPU
    chunk_rows = max(1, budget // weight.shape[0])
    keep = keeps_probabilities(hidden, weight)
    lp, ent = _TokenLogprobs.apply(hidden.to(weight.dtype), weight, targets, chunk_rows, with_entropy, keep)
    return lp, ent if with_entropy else None


def keeps_probabilities(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the forward keeps the [N, V] probabilities for the backward (a CPU batch within
    KEEP_ELEMENTS_CPU that will have one) instead of the backward projecting them again."""
    return (
        hidden.requires_grad
        and torch.is_grad_enabled()
        and hidden.device.type == "cpu"
        and hidden.shape[0] * weight.shape[0] <= KEEP_ELEMENTS_CPU
    )
