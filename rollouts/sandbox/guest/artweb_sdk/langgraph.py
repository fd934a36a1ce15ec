"""`art.langgraph`: ART's LangGraph integration, `wrap_rollout` and `init_chat_model`.

wrap_rollout(model, fn) runs the rollout under capture_auto_trajectory, so every chat completion the agent
makes through LangChain (or any other client) becomes the trajectory's conversation, and its other
conversations its additional_histories, as ART's logging wrapper arranges them. init_chat_model() gives
the agent a LangChain chat model on the policy; it needs the `langchain-openai` package, and says so when
the sandbox's interpreter lacks it.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from typing import Any

from .capture import AutoTrajectoryContext
from .trajectory import Trajectory

# The model of the rollout that wrap_rollout is running in this asyncio context.
wrapped_model: contextvars.ContextVar[Any] = contextvars.ContextVar("art_langgraph_model", default=None)


def wrap_rollout(model: Any, fn: Callable) -> Callable:
    """A coroutine function that runs fn(*args, **kwargs), which returns an art.Trajectory, and gives that
    trajectory the conversations recorded while it ran (when any were)."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Trajectory:
        context = AutoTrajectoryContext()
        token = wrapped_model.set(model)
        try:
            result = await context.run(fn(*args, **kwargs))
        finally:
            wrapped_model.reset(token)
        if not isinstance(result, Trajectory):
            raise TypeError(
                f"a rollout wrapped by art.langgraph.wrap_rollout must return an art.Trajectory, "
                f"not {type(result).__name__}"
            )
        recorded = context.trajectory
        if recorded.messages_and_choices:
            result.messages_and_choices = recorded.messages_and_choices
            result.tools = recorded.tools
        result.additional_histories.extend(recorded.additional_histories)
        return result

    return wrapper


def init_chat_model(
    model: None = None,
    *,
    model_provider: str | None = None,
    configurable_fields: None = None,
    config_prefix: str | None = None,
    **kwargs: Any,
) -> Any:
    """A LangChain ChatOpenAI on the policy of the rollout wrap_rollout is running (temperature 1.0, as
    ART's), sharing the SDK client's connection, which asks for the token ids training needs."""
    policy = wrapped_model.get()
    if policy is None:
        raise RuntimeError(
            "art.langgraph.init_chat_model() must be called inside a rollout wrapped with "
            "art.langgraph.wrap_rollout(model, fn): it serves that rollout's model."
        )
    try:
        from langchain_openai import ChatOpenAI
    except ImportError as exc:
        raise ImportError(
            "art.langgraph.init_chat_model needs the packages langchain-openai and langchain-core, which the "
            "sandbox's Python does not have: ask the operator to install them for the sandbox, or call "
            "model.openai_client() yourself."
        ) from exc
    policy.openai_client()  # builds the shared HTTP client
    return ChatOpenAI(
        base_url=policy.inference_base_url,
        api_key=policy.inference_api_key,
        model=policy.get_inference_name(),
        temperature=1.0,
        http_async_client=policy.http_client,
    )
