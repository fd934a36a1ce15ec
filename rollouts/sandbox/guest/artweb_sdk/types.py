"""`art.types`: the message and tool types of ART's annotations, its training configs and results.

The message types are OpenAI's; they are looked up on first use, so `import art` does not import the
OpenAI library (most of a second of CPU) before the script's first request needs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# Names defined from OpenAI's types on first access (see __getattr__).
OPENAI_TYPES = ("Choice", "Message", "MessageOrChoice", "Messages", "MessagesAndChoices", "Tools")


def openai_types() -> dict[str, Any]:
    from typing import Annotated

    from openai.types.chat.chat_completion import Choice
    from openai.types.chat.chat_completion_message_param import ChatCompletionMessageParam
    from openai.types.chat.chat_completion_tool_param import ChatCompletionToolParam
    from pydantic import SkipValidation

    message = Annotated[ChatCompletionMessageParam, SkipValidation]  # as ART: a pydantic field is not checked
    return {
        "Choice": Choice,
        "Message": message,
        "MessageOrChoice": message | Choice,
        "Messages": list[message],
        "MessagesAndChoices": list[message | Choice],
        "Tools": list[ChatCompletionToolParam],
    }


def __getattr__(name: str) -> Any:
    if name in OPENAI_TYPES:
        found = openai_types()
        globals().update(found)
        return found[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TrainConfig:
    """Accepted so ART scripts import cleanly; artweb takes hyperparameters from the run, and
    `model.train(...)` raises in the sandbox."""

    def __init__(
        self,
        learning_rate: float = 5e-6,
        kl_penalty_coef: float = 0.0,
        grad_accumulation_sequences: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.learning_rate = learning_rate
        self.kl_penalty_coef = kl_penalty_coef
        self.grad_accumulation_sequences = grad_accumulation_sequences
        self.__dict__.update(kwargs)

    def __repr__(self) -> str:
        return f"TrainConfig({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


class TrainSFTConfig:
    """ART's supervised fine-tuning settings: accepted so scripts import; artweb trains with RL only, and
    `model.train_sft(...)` raises in the sandbox."""

    def __init__(self, learning_rate: float | list[float] = 5e-5, batch_size: int | str = "auto", **kwargs: Any):
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.__dict__.update(kwargs)

    def __repr__(self) -> str:
        return f"TrainSFTConfig({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


Verbosity = Literal[0, 1, 2]


@dataclass
class TrainResult:
    """What ART's `backend.train()` returns: the step reached and the step's training metrics."""

    step: int
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class LocalTrainResult(TrainResult):
    checkpoint_path: str | None = None


@dataclass
class ServerlessTrainResult(TrainResult):
    artifact_name: str | None = None
