"""`art.dev`: the advanced configuration dicts an ART script may build.

They are dicts (TypedDicts, as in ART): building one, passing it to `art.TrainableModel(_internal_config=...)`
or keeping it works, and the values stay as given. None of them changes anything in artweb, which serves
the policy and trains it from the run's settings; the calls that would only feed them to ART's own vLLM
server or GPUs raise NotSupportedInSandbox rather than return something nothing reads.
"""

from __future__ import annotations

from typing import Any, TypedDict

from .errors import NotSupportedInSandbox

# The keys are ART's; artweb reads none of them, so none is declared here: a type checker outside the
# sandbox checks them against ART's own definitions.


class EngineArgs(TypedDict, total=False):
    """vLLM engine arguments of ART's own inference server."""


class ServerArgs(TypedDict, total=False):
    """vLLM OpenAI-server arguments of ART's own inference server."""


class OpenAIServerConfig(TypedDict, total=False):
    """ART's inference server: log_file, server_args, engine_args."""


class InitArgs(TypedDict, total=False):
    """Arguments ART gives its model loader."""


class PeftArgs(TypedDict, total=False):
    """ART's LoRA settings."""


class TrainerArgs(TypedDict, total=False):
    """ART's trainer arguments."""


class TinkerTrainingClientArgs(TypedDict, total=False):
    """Arguments of Tinker's training client."""


class TinkerArgs(TypedDict, total=False):
    """ART's Tinker backend settings."""


class TinkerNativeArgs(TypedDict, total=False):
    """ART's native Tinker backend settings."""


class InternalModelConfig(TypedDict, total=False):
    """A model's advanced settings: init_args, engine_args, peft_args, trainer_args, GPU ids, chat template."""


class TrainConfig(TypedDict, total=False):
    """ART's advanced RL settings (`model.train(..., _config=...)`); artweb's are the run's settings."""


class TrainSFTConfig(TypedDict, total=False):
    """ART's advanced SFT settings."""


def is_dedicated_mode(config: dict) -> bool:
    """Whether the config gives separate GPUs to training and inference (both GPU id lists set)."""
    return "trainer_gpu_ids" in config and "inference_gpu_ids" in config


def validate_dedicated_config(config: dict) -> None:
    raise NotSupportedInSandbox(
        "art.dev.validate_dedicated_config",
        "it checks how ART would share GPUs between its trainer and its vLLM server; artweb's workers own the GPUs.",
    )


def get_openai_server_config(*args: Any, **kwargs: Any) -> OpenAIServerConfig:
    raise NotSupportedInSandbox(
        "art.dev.get_openai_server_config",
        "it configures ART's own vLLM server, and artweb serves the policy itself; the config would reach nothing.",
    )
