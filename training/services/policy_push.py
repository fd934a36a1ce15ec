"""Where a GPU worker's inference server, in merged mode, takes a step's policy from: the worker's trainer.

The trainer already holds the base weights on the card the server runs on, so a policy is folded into them
there and copied into the server's weights (rollouts.inference.weight_push) instead of being merged into a
copy on disk and read back. That takes the trainer loaded in this process for the server's own base model,
with plain (not 4-bit) base weights on the server's GPU, and an adapter, the new and the one it replaces,
that changes only weights under the trainer's LoRA layers (those are the weights a copy replaces); otherwise
the server loads the merged copy from disk as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.conf import settings

from rollouts.inference.weight_push import adapter_layers, lora_base_weights, merged_weights
from training.services.trainer_pool import trainer_loaded

logger = logging.getLogger(__name__)


def trainer_weights(model_path: str, adapter: str | None, previous: str | None) -> Iterator | None:
    """The weights to copy into a server of model_path for `adapter` (None: the base model) in place of
    `previous` (the adapter it holds, None: the base), or None where the trainer cannot give them."""
    trainer = trainer_loaded()
    if trainer is None or trainer.base_model_path != str(model_path) or settings.ARTWEB["VLLM_CUDA_DEVICES"]:
        return None  # another model, or the server on a GPU of its own
    try:
        base = lora_base_weights(trainer.model)
    except RuntimeError:  # closed since: nothing loaded
        return None
    if base is None:
        return None
    for path in (adapter, previous):
        if path and not adapter_layers(path) <= base.keys():
            logger.info("%s changes weights outside the trainer's LoRA layers: the server loads it from disk", path)
            return None
    return merged_weights(base, adapter)
