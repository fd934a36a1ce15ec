"""Merged-weights serving: base + adapter folded exactly as PEFT's own merge does."""

import torch
from safetensors.torch import load_file

from rollouts.runtime.merge import merge_adapter
from tests.fixtures.vllm import default_model_dir
from tests.rollouts.runtime.adapters import make_adapter


def test_it_merges_like_peft(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = default_model_dir()
    adapter = make_adapter(tmp_path / "adapter", seed=3, std=0.02)
    merged = load_file(str(merge_adapter(base, adapter, tmp_path / "merged") / "model.safetensors"))

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    expected = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().state_dict()
    original = load_file(str(base / "model.safetensors"))
    for key in ("model.layers.0.self_attn.q_proj.weight", "model.layers.29.mlp.down_proj.weight"):
        assert merged[key].dtype == original[key].dtype
        assert not torch.equal(merged[key], original[key])
        torch.testing.assert_close(merged[key].float(), expected[key].to(merged[key].dtype).float())
    assert torch.equal(merged["model.norm.weight"], original["model.norm.weight"])
