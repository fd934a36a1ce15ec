"""A served run: the default model registered and a finished run with a real LoRA checkpoint, for the
serving tests and the serving benchmark."""

from __future__ import annotations

from pathlib import Path

from artweb.testing.factories import RunFactory
from artweb.testing.weights import make_adapter
from training.models import Checkpoint, PretrainedModel
from training.services import base_model_register


def make_served_run(owner, model_dir, adapter_dir: Path):
    """The default model registered (shared), and a finished run of owner's with a real LoRA checkpoint at
    step 1 (a random adapter saved by PEFT, as the trainer saves one): (model, run, checkpoint)."""
    model = PretrainedModel.objects.filter(name="SmolLM2-135M-Instruct").first() or base_model_register(
        name="SmolLM2-135M-Instruct", source=str(model_dir), local_path=str(model_dir), supports_tools=True
    )
    run = RunFactory(owner=owner, base_model=model, status="completed", num_steps=1, steps_done=1)
    adapter = make_adapter(adapter_dir, seed=7, std=0.05)
    return model, run, Checkpoint.objects.create(run=run, step=1, path=str(adapter), val_reward=0.5)
