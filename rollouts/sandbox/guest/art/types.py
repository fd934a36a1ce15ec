"""`art.types`: ART's message, tool and training types (artweb_sdk.types)."""

from typing import Any

import artweb_sdk.types as _types
from artweb_sdk.types import (  # noqa: F401 - ART's names
    LocalTrainResult,
    ServerlessTrainResult,
    TrainConfig,
    TrainResult,
    TrainSFTConfig,
    Verbosity,
)


def __getattr__(name: str) -> Any:
    # Choice, Message, MessageOrChoice, Messages, MessagesAndChoices, Tools: OpenAI's types, on first use.
    return getattr(_types, name)
