"""Each loss against values computed by hand on three tokens."""

import math

import pytest
import torch

from training.engine.losses import aggregate, cispo_loss, gspo_loss, kl_k3, ppo_loss

# Three tokens with ratios r = π_θ/π_old of 0.5, 1.0 and 6.0.
OLD = torch.log(torch.tensor([0.2, 0.4, 0.1]))
NEW = torch.log(torch.tensor([0.1, 0.4, 0.6]))
ADV = torch.tensor([1.0, -2.0, 1.0])


def test_cispo_clips_the_detached_weight_and_keeps_every_gradient():
    new = NEW.clone().requires_grad_(True)
    out = cispo_loss(new, OLD, ADV, eps_low=1.0, eps_high=4.0)
    # weights clip(r, 0, 5) = [0.5, 1.0, 5.0]; loss = -w · A · log π_θ
    expected = [-0.5 * 1.0 * math.log(0.1), -1.0 * -2.0 * math.log(0.4), -5.0 * 1.0 * math.log(0.6)]
    assert out.per_token.tolist() == pytest.approx(expected, rel=1e-5)
    assert out.clipped.tolist() == [False, False, True]
    out.per_token.sum().backward()
    # d loss / d log π_θ = -w · A, non-zero even for the clipped token
    assert new.grad.tolist() == pytest.approx([-0.5, 2.0, -5.0], rel=1e-5)


def test_ppo_takes_the_pessimistic_clipped_surrogate():
    new = NEW.clone().requires_grad_(True)
    out = ppo_loss(new, OLD, ADV, eps_low=0.2, eps_high=0.2)
    # token 0: r=0.5, A=1  → min(0.5, 0.8) = 0.5 (unclipped)
    # token 1: r=1.0, A=-2 → min(-2, -2)   = -2
    # token 2: r=6.0, A=1  → min(6.0, 1.2) = 1.2 (clipped: no gradient)
    assert out.per_token.tolist() == pytest.approx([-0.5, 2.0, -1.2], rel=1e-5)
    assert out.clipped.tolist() == [False, False, True]
    out.per_token.sum().backward()
    # d(-r·A)/d log π_θ = -r·A where unclipped, 0 where clipped
    assert new.grad.tolist() == pytest.approx([-0.5, 2.0, 0.0], rel=1e-5, abs=1e-7)


def test_gspo_uses_the_geometric_mean_ratio_of_each_sequence():
    # sequence 0 = tokens 0,1 (A = 1); sequence 1 = token 2 (A = -1)
    seq_ids = torch.tensor([0, 0, 1])
    adv = torch.tensor([1.0, 1.0, -1.0])
    out = gspo_loss(NEW, OLD, adv, seq_ids, eps_low=0.2, eps_high=0.2)
    s0 = math.sqrt(0.5 * 1.0)  # exp(mean(log 0.5, log 1)) ≈ 0.707, below 0.8 but A>0 → unclipped
    s1 = 6.0  # clip → 1.2; A<0: min(-6, -1.2) = -6 → unclipped
    assert out.per_token.tolist() == pytest.approx([-s0, -s0, s1], rel=1e-5)
    assert out.clipped.tolist() == [False, False, False]
    out2 = gspo_loss(NEW, OLD, torch.tensor([1.0, 1.0, 1.0]), seq_ids, eps_low=0.2, eps_high=0.2)
    assert out2.per_token[2].item() == pytest.approx(-1.2) and out2.clipped[2].item()


def test_k3_kl_is_zero_on_equal_policies_and_matches_the_formula():
    assert kl_k3(NEW, NEW).tolist() == [0.0, 0.0, 0.0]
    # d = ref - new = log(0.5) → 0.5 - log 0.5 - 1
    assert kl_k3(torch.log(torch.tensor([0.2])), torch.log(torch.tensor([0.1]))).item() == pytest.approx(
        0.5 - math.log(0.5) - 1.0, rel=1e-5
    )


def test_token_and_sequence_aggregation():
    per_token = torch.tensor([1.0, 3.0, 8.0])  # sequence 0: tokens 0,1; sequence 1: token 2
    seq_ids = torch.tensor([0, 0, 1])
    counts = torch.tensor([2, 1])
    assert aggregate(per_token, seq_ids, counts, "token", 3, 2).item() == pytest.approx(12 / 3)
    # mean per sequence: 2 and 8 → mean over sequences 5
    assert aggregate(per_token, seq_ids, counts, "sequence", 3, 2).item() == pytest.approx(5.0)
    # Shares of a split batch add up to the whole, since denominators are global.
    first = aggregate(per_token[:2], seq_ids[:2], counts, "sequence", 3, 2)
    second = aggregate(per_token[2:], torch.tensor([0]), torch.tensor([1]), "sequence", 3, 2)
    assert (first + second).item() == pytest.approx(5.0)


def test_chunked_token_logprobs_match_the_direct_computation():
    from training.engine import logprobs as lp_module

    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False, dtype=torch.float64).requires_grad_(False)
    hidden = torch.randn(7, 8, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (7,))
    weights = torch.randn(7, dtype=torch.float64)

    log_p = torch.log_softmax(hidden @ head.weight.T, dim=-1)
    expected_lp = log_p.gather(1, targets[:, None]).squeeze(1)
    expected_ent = -(log_p.exp() * log_p).sum(-1)
    (expected_lp * weights).sum().backward()
    expected_grad, hidden.grad = hidden.grad.clone(), None

    # 3 rows a chunk: 3 chunks; the probabilities kept for the backward (7 x 50 fit), then projected again.
    for keep_budget, kept in ((7 * 50, True), (7 * 50 - 1, False)):
        saved = lp_module.CHUNK_ELEMENTS_CPU, lp_module.KEEP_ELEMENTS_CPU
        lp_module.CHUNK_ELEMENTS_CPU, lp_module.KEEP_ELEMENTS_CPU = 3 * 50, keep_budget
        try:
            assert lp_module.keeps_probabilities(hidden, head.weight) is kept
            got_lp, got_ent = lp_module.token_logprobs(hidden, head, targets, with_entropy=True)
            (got_lp * weights).sum().backward()
        finally:
            lp_module.CHUNK_ELEMENTS_CPU, lp_module.KEEP_ELEMENTS_CPU = saved
        got_grad, hidden.grad = hidden.grad.clone(), None
        torch.testing.assert_close(got_lp.double(), expected_lp, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got_ent.double(), expected_ent, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got_grad, expected_grad, rtol=1e-5, atol=1e-6)


def test_kept_probabilities_are_not_changed_by_the_backward():
    """The backward scales a copy of the kept probabilities: a second backward through the same graph
    (retain_graph) gives the same gradient as the first."""
    from training.engine import logprobs as lp_module

    torch.manual_seed(1)
    head = torch.nn.Linear(8, 50, bias=False).requires_grad_(False)
    hidden = torch.randn(5, 8, requires_grad=True)
    targets = torch.randint(0, 50, (5,))
    assert lp_module.keeps_probabilities(hidden, head.weight)
    with torch.no_grad():  # the reference policy's log-probs: no backward, nothing to keep
        assert not lp_module.keeps_probabilities(hidden, head.weight)
    lp, _ = lp_module.token_logprobs(hidden, head, targets, with_entropy=False)
    lp.sum().backward(retain_graph=True)
    first, hidden.grad = hidden.grad.clone(), None
    lp.sum().backward()
    torch.testing.assert_close(hidden.grad, first)
    assert first.abs().sum() > 0
