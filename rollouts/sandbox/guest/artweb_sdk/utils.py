"""`art.utils`: ART's helpers for rollout scripts, with ART's signatures and behaviour.

retry, limit_concurrency and log_http_errors are decorators a script applies at import time; iterate_dataset
walks a dataset in steps and epochs (the same order as ART's); strip_logprobs and format_message work on
messages. Helpers that need ART's own storage or W&B raise NotSupportedInSandbox.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import logging
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .errors import NotSupportedInSandbox

T = TypeVar("T")
logger = logging.getLogger("art")


def retry(
    max_attempts: int = 3,
    delay: float = 0.25,
    backoff_factor: float = 2.0,
    exceptions: tuple = (Exception,),
    on_retry: Callable[[Exception, int], None] | None = None,
):
    """Call the function again when it raises one of `exceptions`, up to max_attempts calls in all.

    The first wait is `delay` seconds, each next one backoff_factor times longer; the last failure is
    raised. Before each wait, on_retry(exception, attempt) is called, or a warning logged (which lands in
    the rollout's logs). Works on plain and async functions.
    """

    def announce(func: Callable, exc: Exception, attempt: int) -> None:
        if on_retry is not None:
            on_retry(exc, attempt)
        else:
            logger.warning("Retry %d/%d for %s after error: %s", attempt, max_attempts, func.__name__, exc)

    def decorator(func: Callable) -> Callable:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def retrying_coroutine(*args: Any, **kwargs: Any) -> Any:
                wait = delay
                for attempt in range(1, max_attempts + 1):
                    try:
                        return await func(*args, **kwargs)
                    except exceptions as exc:
                        if attempt >= max_attempts:
                            raise
                        announce(func, exc, attempt)
                        await asyncio.sleep(wait)
                        wait *= backoff_factor
                raise ValueError("retry needs max_attempts >= 1")

            return retrying_coroutine

        @functools.wraps(func)
        def retrying(*args: Any, **kwargs: Any) -> Any:
            wait = delay
            for attempt in range(1, max_attempts + 1):
                try:
                    return func(*args, **kwargs)
                except exceptions as exc:
                    if attempt >= max_attempts:
                        raise
                    announce(func, exc, attempt)
                    time.sleep(wait)
                    wait *= backoff_factor
            raise ValueError("retry needs max_attempts >= 1")

        return retrying

    return decorator


@dataclass
class DatasetBatch(Generic[T]):
    """One step of iterate_dataset: its items, its global step, its epoch and its step within the epoch."""

    items: list[T]
    step: int
    epoch: int
    epoch_step: int


def iterate_dataset(
    dataset: list[T],
    groups_per_step: int = 1,
    num_epochs: int = 1,
    initial_step: int = 0,
    use_tqdm: bool = True,
) -> Iterator[DatasetBatch[T]]:
    """The dataset in steps of groups_per_step items, epoch after epoch, each epoch in its own shuffled
    order: the epoch number seeds the shuffle, so every run (and ART) walks the same order. Steps before
    initial_step are skipped (resuming). The last step of an epoch may hold fewer items.

    use_tqdm is accepted for ART's signature; the sandbox draws no progress bar. Python's global random
    state is left as it was.
    """
    if groups_per_step < 1:
        raise ValueError("groups_per_step must be at least 1")
    size = len(dataset)
    steps_per_epoch = math.ceil(size / groups_per_step)
    for epoch in range(num_epochs):
        order = list(range(size))
        random.Random(epoch).shuffle(order)
        for epoch_step in range(steps_per_epoch):
            step = epoch * steps_per_epoch + epoch_step
            if step < initial_step:
                continue
            chosen = order[epoch_step * groups_per_step : (epoch_step + 1) * groups_per_step]
            yield DatasetBatch(items=[dataset[i] for i in chosen], step=step, epoch=epoch, epoch_step=epoch_step)


def limit_concurrency(n: int, derive_key: Callable[..., Any] | None = None):
    """At most n calls of the decorated coroutine function run at once; with derive_key, at most n per
    key that derive_key(*args, **kwargs) returns."""

    def decorator(func: Callable) -> Callable:
        semaphores: dict[Any, asyncio.Semaphore] = {}

        @functools.wraps(func)
        async def limited(*args: Any, **kwargs: Any) -> Any:
            key = derive_key(*args, **kwargs) if derive_key is not None else None
            semaphore = semaphores.setdefault(key, asyncio.Semaphore(n))
            async with semaphore:
                return await func(*args, **kwargs)

        return limited

    return decorator


def strip_logprobs(obj: Any) -> Any:
    """A deep copy of obj without log-probabilities: "logprobs" keys are left out of dicts and "logprobs"
    attributes of objects set to None, at any depth. If obj cannot be copied it is returned as it is (with
    a warning), never changed in place."""
    try:
        copied = copy.deepcopy(obj)
    except Exception as exc:
        logger.warning("strip_logprobs could not copy %s (%s); returning it unchanged", type(obj).__name__, exc)
        return obj
    return _without_logprobs(copied)


def _without_logprobs(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _without_logprobs(v) for k, v in obj.items() if k != "logprobs"}
    if isinstance(obj, (list, tuple)):
        items = [_without_logprobs(v) for v in obj]
        return tuple(items) if isinstance(obj, tuple) else items
    if hasattr(obj, "__dict__"):
        for name, value in list(vars(obj).items()):
            setattr(obj, name, None if name == "logprobs" else _without_logprobs(value))
    return obj


def format_message(message: dict) -> str:
    """A message as text: "Role:", then its content (or refusal), then one `name(arguments)` line per
    tool call."""
    content = message.get("content", message.get("refusal", "")) or ""
    calls = [
        f"{call['function']['name']}({call['function']['arguments']})"
        for call in message.get("tool_calls") or []
        if "function" in call
    ]
    # As ART's: a line break after non-empty content, tool calls or not.
    return f"{message['role'].capitalize()}:\n{content}" + ("\n" if content else "") + "\n".join(calls)


def log_http_errors(func: Callable) -> Callable:
    """An httpx.HTTPStatusError raised by the decorated coroutine function becomes an Exception that says
    the status, the URL and the response's JSON "detail"."""

    @functools.wraps(func)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        import httpx

        try:
            return await func(*args, **kwargs)
        except httpx.HTTPStatusError as exc:
            try:
                detail = exc.response.json().get("detail")
            except Exception:
                raise exc from None
            raise Exception(f"[HTTP {exc.response.status_code}] {exc.request.url} {detail}") from exc

    return wrapper


def get_model_step(model: Any, art_path: str) -> int:
    raise NotSupportedInSandbox(
        "art.utils.get_model_step",
        "it reads checkpoints from ART's local storage, which the sandbox does not have.",
        "Use `await model.get_step()`: the step being rolled out.",
    )


def record_provenance(run: Any, provenance: str) -> None:
    raise NotSupportedInSandbox(
        "art.utils.record_provenance", "it writes to W&B, which the sandbox cannot reach.", "Use a run export."
    )
