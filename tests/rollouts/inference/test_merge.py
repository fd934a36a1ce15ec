"""Merged-weights serving: base + adapter folded exactly as PEFT's own merge does."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from artweb.testing.weights import default_model_dir, make_adapter
from rollouts.inference.merge import MergeError, merge_adapter, rewrite_merged


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


@pytest.mark.slow
def test_a_new_adapter_is_written_over_the_previous_merged_copy(tmp_path):
    base = default_model_dir()
    first = make_adapter(tmp_path / "first", seed=3, std=0.02)
    second = make_adapter(tmp_path / "second", seed=4, std=0.02)
    fresh = load_file(str(merge_adapter(base, second, tmp_path / "fresh") / "model.safetensors"))

    live = merge_adapter(base, first, tmp_path / "live")
    size = (live / "model.safetensors").stat().st_size
    assert rewrite_merged(base, second, live)
    rewritten = load_file(str(live / "model.safetensors"))
    assert rewritten.keys() == fresh.keys() and (live / "model.safetensors").stat().st_size == size
    for key, tensor in fresh.items():  # bit for bit: nothing of the first adapter is left
        assert torch.equal(rewritten[key], tensor), key

    assert rewrite_merged(base, first, live)  # and back
    again = load_file(str(live / "model.safetensors"))
    expected = load_file(str(merge_adapter(base, first, tmp_path / "first-fresh") / "model.safetensors"))
    assert all(torch.equal(again[key], expected[key]) for key in expected)


def test_a_rewrite_leaves_alone_what_it_cannot_write_over(tmp_path):
    base = default_model_dir()
    adapter = make_adapter(tmp_path / "adapter", seed=3, std=0.02)
    assert not rewrite_merged(base, adapter, tmp_path / "nothing-here")

    # Weights of another layout (here: one tensor in float32 instead of the base's bfloat16).
    other = tmp_path / "other"
    other.mkdir()
    state = load_file(str(base / "model.safetensors"))
    state["model.norm.weight"] = state["model.norm.weight"].float()
    save_file(state, str(other / "model.safetensors"))
    before = (other / "model.safetensors").read_bytes()
    assert not rewrite_merged(base, adapter, other)
    assert (other / "model.safetensors").read_bytes() == before

    # Not a weights file at all.
    (other / "model.safetensors").write_bytes(b"\x05\x00")
    assert not rewrite_merged(base, adapter, other)
    assert (other / "model.safetensors").read_bytes() == b"\x05\x00"


def test_an_adapter_for_another_model_is_refused_before_anything_is_written(tmp_path):
    base = default_model_dir()
    live = merge_adapter(base, make_adapter(tmp_path / "first", seed=3, std=0.02), tmp_path / "live")
    before = (live / "model.safetensors").read_bytes()
    stranger = make_adapter(tmp_path / "stranger", seed=4, std=0.02)
    tensors = load_file(str(stranger / "adapter_model.safetensors"))
    renamed = {key.replace("layers.0.", "layers.99."): value for key, value in tensors.items()}
    save_file(renamed, str(stranger / "adapter_model.safetensors"))
    with pytest.raises(MergeError, match="no matching base weight"):
        rewrite_merged(base, stranger, live)
    assert (live / "model.safetensors").read_bytes() == before
