"""`art.utils.sft`: ART's supervised fine-tuning from files, which artweb does not do."""

from typing import Any

from artweb_sdk.errors import NotSupportedInSandbox


def _no_sft(feature: str) -> NotSupportedInSandbox:
    return NotSupportedInSandbox(
        feature, "artweb trains with reinforcement learning from the run's rollouts; it has no supervised fine-tuning."
    )


def create_sft_dataset_iterator(*args: Any, **kwargs: Any) -> Any:
    raise _no_sft("art.utils.sft.create_sft_dataset_iterator")


async def train_sft_from_file(*args: Any, **kwargs: Any) -> None:
    raise _no_sft("art.utils.sft.train_sft_from_file")
