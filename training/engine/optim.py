"""A run's optimizer and learning-rate schedule over a LoRA's parameters, from its TrainConfig: AdamW over the
trainable parameters in name order (the order a checkpoint's optimizer state is saved and checked in), and
the schedule TrainConfig names."""

from __future__ import annotations

from typing import Any

import torch

from training.engine.config import TrainConfig


def new_optimizer(cfg: TrainConfig, model: Any) -> tuple[list[str], torch.optim.Optimizer, Any]:
    """(the trainable parameters' names, in the optimizer's order; the optimizer; its schedule)."""
    named = sorted((n, p) for n, p in model.named_parameters() if p.requires_grad)
    optimizer = torch.optim.AdamW(
        [p for _, p in named],
        lr=cfg.learning_rate,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        eps=cfg.adam_epsilon,
        weight_decay=cfg.weight_decay,
    )
    return [n for n, _ in named], optimizer, _schedule(cfg, optimizer)


def _schedule(cfg: TrainConfig, optimizer: torch.optim.Optimizer) -> Any:
    from transformers import get_scheduler

    name = {
        "constant": "constant_with_warmup" if cfg.warmup_steps else "constant",
        "linear": "linear",
        "cosine": "cosine",
    }[cfg.lr_scheduler]
    return get_scheduler(name, optimizer, num_warmup_steps=cfg.warmup_steps, num_training_steps=cfg.total_steps)
