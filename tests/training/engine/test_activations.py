"""The gated MLP's fused activation: the same values and gradients as the layers it replaces, less kept
for the backward pass, and only where a model's MLP is exactly the form it computes."""

import pytest
import torch

from training.engine.activations import fuse_gated_mlps, silu_mul


def _model(tiny_model_dir, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_fused_model_gives_the_same_logits_and_gradients(tiny_model_dir, dtype):
    plain, fused = _model(tiny_model_dir, dtype), _model(tiny_model_dir, dtype)
    assert fuse_gated_mlps(fused) == plain.config.num_hidden_layers
    ids = torch.randint(0, plain.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    grads = []
    for model in (plain, fused):
        logits = model(input_ids=ids).logits
        logits.float().log_softmax(-1)[..., :50].sum().backward()
        grads.append({n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and any("mlp" in n for n in grads[0])
    if dtype == torch.float32:
        for name, grad in grads[0].items():
            torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-5, msg=name)
    else:
        # bf16: autograd rounds each product to bf16 where the fused backward rounds once, so the two
        # differ by bf16's rounding (2**-8), not more.
        for name, grad in grads[0].items():
            assert (grads[1][name] - grad).norm() <= 2e-2 * grad.norm(), name


def test_it_keeps_two_tensors_where_autograd_keeps_three():
    gate = torch.randn(5, 7, requires_grad=True)
    up = torch.randn(5, 7, requires_grad=True)

    def kept_by(compute) -> int:
        kept = set()

        def keep(tensor):
            kept.add(tensor.untyped_storage().data_ptr())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
            compute()
        return len(kept)

    assert kept_by(lambda: torch.nn.functional.silu(gate) * up) == 3
    assert kept_by(lambda: silu_mul(gate, up)) == 2


def test_an_mlp_of_another_form_is_left_as_it_is(tiny_model_dir):
    model = _model(tiny_model_dir)

    class OtherMLP(torch.nn.Module):  # the same layers, another computation
        def __init__(self, mlp):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj, self.act_fn = (
                mlp.gate_proj,
                mlp.up_proj,
                mlp.down_proj,
                mlp.act_fn,
            )

        def forward(self, x):
            return self.down_proj(self.act_fn(self.up_proj(x)) * self.gate_proj(x))

    model.model.layers[0].mlp = OtherMLP(model.model.layers[0].mlp)
    model.model.layers[1].mlp.act_fn = torch.nn.GELU()
    assert fuse_gated_mlps(model) == 0
    assert "forward" not in vars(model.model.layers[0].mlp) and "forward" not in vars(model.model.layers[1].mlp)
