"""`art.dev`: ART's advanced configuration dicts (artweb_sdk.dev says what they do in artweb: nothing)."""

from artweb_sdk.dev import (
    EngineArgs,
    InitArgs,
    InternalModelConfig,
    OpenAIServerConfig,
    PeftArgs,
    ServerArgs,
    TinkerArgs,
    TinkerNativeArgs,
    TinkerTrainingClientArgs,
    TrainConfig,
    TrainerArgs,
    TrainSFTConfig,
    get_openai_server_config,
    is_dedicated_mode,
    validate_dedicated_config,
)

__all__ = [
    "EngineArgs",
    "InitArgs",
    "InternalModelConfig",
    "OpenAIServerConfig",
    "PeftArgs",
    "ServerArgs",
    "TinkerArgs",
    "TinkerNativeArgs",
    "TinkerTrainingClientArgs",
    "TrainConfig",
    "TrainSFTConfig",
    "TrainerArgs",
    "get_openai_server_config",
    "is_dedicated_mode",
    "validate_dedicated_config",
]
