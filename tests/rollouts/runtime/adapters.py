"""A small random LoRA adapter for the default model, saved the way the trainer saves one (PEFT)."""

from pathlib import Path


def make_adapter(out_dir: Path, *, seed: int, std: float, rank: int = 8) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tests.fixtures.vllm import default_model_dir

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
