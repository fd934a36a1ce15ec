"""ART's two ways of building a trajectory without returning it: `capture_auto_trajectory` records every chat
completion the code makes, `capture_yielded_trajectory` takes the one it hands to `yield_trajectory`.

Recording works at the HTTP client: while a capture is active in the current asyncio context, each chat
completion request sent through an httpx (or httpx2) client, whoever built it (`model.openai_client()`,
an `AsyncOpenAI` of the script's own, a library on top of one), adds its new request messages and the
returned choice to the trajectory. A request that continues the trajectory's conversation extends it;
any other starts or extends one of its `additional_histories`, as in ART. The clients are hooked on the
first capture only, so scripts that never capture pay nothing.

In artweb, the runner trains what `rollout()` returns, so a rollout written this way returns the capture:
`return await art.capture_auto_trajectory(play(model, scenario))`.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import inspect
import json
import logging
from collections.abc import Awaitable
from typing import Any

from .errors import NotSupportedInSandbox
from .trajectory import History, Trajectory, message_dict

logger = logging.getLogger("art")


class AutoTrajectoryContext:
    """The trajectory a capture_auto_trajectory call builds from the chat completions made inside it."""

    def __init__(self) -> None:
        self.trajectory = Trajectory()
        # Why a request could not be recorded. Raised where it happens, inside the HTTP client, and again
        # when the capture ends: some OpenAI client versions turn any error in sending into a bare
        # "Connection error.", and a script may catch it; either way the capture must not end as if whole.
        self.failure: Exception | None = None

    def fail(self, failure: Exception) -> Exception:
        self.failure = self.failure or failure
        return failure

    async def run(self, coroutine: Awaitable[Any]) -> Any:
        """Await coroutine with this capture active; its failure, if any, is what the call raises."""
        hook_http_clients()
        token = auto_context.set(self)
        try:
            result = await coroutine
        except Exception as exc:
            if self.failure is not None and exc is not self.failure:
                raise self.failure from exc
            raise
        finally:
            auto_context.reset(token)
        if self.failure is not None:
            raise self.failure
        return result

    def record(self, request: dict, choice: Any) -> None:
        """Add a completed request: its messages past those already recorded, then the returned choice."""
        messages = list(request.get("messages") or [])
        tools = request.get("tools")
        history = self._history_for([message_dict(m) for m in messages], tools)
        history.messages_and_choices.extend(messages[len(history.messages_and_choices) :])
        history.messages_and_choices.append(choice)
        history.tools = tools

    def _history_for(self, sent: list[dict], tools: Any) -> Trajectory | History:
        """The conversation this request continues: the trajectory's, or one of its additional histories
        (the messages recorded so far begin the request's, with the same tools), or else a new history."""
        for history in [self.trajectory, *self.trajectory.additional_histories]:
            recorded = history.messages()
            same_tools = history.tools == tools or (not recorded and history.tools is None)
            if recorded == sent[: len(recorded)] and same_tools:
                return history
        history = History()
        self.trajectory.additional_histories.append(history)
        return history


auto_context: contextvars.ContextVar[AutoTrajectoryContext | None] = contextvars.ContextVar(
    "art_auto_trajectory", default=None
)


def auto_trajectory(*, required: bool = False) -> Trajectory | None:
    """The trajectory the current capture_auto_trajectory(...) is building, to set its reward or metrics;
    None outside one (or RuntimeError with required=True)."""
    context = auto_context.get()
    if context is None:
        if required:
            raise RuntimeError(
                "No auto trajectory here: auto_trajectory(required=True) must be called inside "
                "capture_auto_trajectory(...)."
            )
        return None
    return context.trajectory


async def capture_auto_trajectory(coroutine: Awaitable[Any]) -> Trajectory:
    """Await coroutine, recording each chat completion it makes into a new trajectory; return it finished
    (metrics["duration"] set)."""
    context = AutoTrajectoryContext()
    try:
        await context.run(coroutine)
    finally:
        context.trajectory.finish()
    return context.trajectory


# --- the HTTP hook -------------------------------------------------------------------------------------


def chat_request(request: Any) -> dict | None:
    """The JSON body of a chat completion request, or None for any other request."""
    if request.method != "POST" or not request.url.path.endswith("/chat/completions"):
        return None
    try:
        body = json.loads(request.content or b"{}")
    except Exception:
        return None
    return body if isinstance(body, dict) and "messages" in body else None


def refuse_streaming(context: AutoTrajectoryContext, body: dict) -> None:
    if body.get("stream"):
        raise context.fail(
            NotSupportedInSandbox(
                "A streamed chat completion inside capture_auto_trajectory",
                "artweb records the sampled token ids of whole responses only, so the streamed one cannot be trained.",
                "Call create() without stream=True inside the capture.",
            )
        )


def returned_choice(context: AutoTrajectoryContext, content: bytes) -> Any:
    from openai.types.chat.chat_completion import Choice

    try:
        return Choice.model_validate(json.loads(content)["choices"][0])
    except Exception as exc:
        failure = ValueError(f"auto_trajectory could not read the chat completion it should record: {exc}")
        raise context.fail(failure) from exc


def _hook_async(client_class: type) -> None:
    send = client_class.send

    @functools.wraps(send)
    async def recording_send(self, request, *args, **kwargs):
        context = auto_context.get()
        body = chat_request(request) if context is not None else None
        if body is None:
            return await send(self, request, *args, **kwargs)
        refuse_streaming(context, body)
        response = await send(self, request, *args, **kwargs)
        if response.status_code == 200:
            await response.aread()  # kept on the response: the caller reads the same bytes
            context.record(body, returned_choice(context, response.content))
        return response

    recording_send.artweb_hooked = True
    client_class.send = recording_send


def _hook_sync(client_class: type) -> None:
    send = client_class.send

    @functools.wraps(send)
    def recording_send(self, request, *args, **kwargs):
        context = auto_context.get()
        body = chat_request(request) if context is not None else None
        if body is None:
            return send(self, request, *args, **kwargs)
        refuse_streaming(context, body)
        response = send(self, request, *args, **kwargs)
        if response.status_code == 200:
            response.read()
            context.record(body, returned_choice(context, response.content))
        return response

    recording_send.artweb_hooked = True
    client_class.send = recording_send


def hook_http_clients() -> None:
    """Hook the send methods of httpx's and httpx2's clients (whichever are installed), once."""
    for name in ("httpx", "httpx2"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for client_class, hook in ((module.AsyncClient, _hook_async), (module.Client, _hook_sync)):
            if not getattr(client_class.send, "artweb_hooked", False):
                hook(client_class)


# --- yield_trajectory ------------------------------------------------------------------------------------


class YieldedTrajectory:
    def __init__(self) -> None:
        self.trajectory: Trajectory | None = None


yield_context: contextvars.ContextVar[YieldedTrajectory | None] = contextvars.ContextVar(
    "art_yielded_trajectory", default=None
)


def yield_trajectory(trajectory: Trajectory) -> None:
    """Hand the trajectory to the surrounding capture_yielded_trajectory(...) (the last one handed wins)."""
    if not isinstance(trajectory, Trajectory):
        raise TypeError(f"yield_trajectory takes an art.Trajectory, not {type(trajectory).__name__}")
    box = yield_context.get()
    if box is None:
        # As in ART, nothing receives it here; say so in the rollout's log rather than lose it unnoticed.
        logger.warning(
            "yield_trajectory() was called outside capture_yielded_trajectory(...): nothing receives this "
            "trajectory. artweb trains the trajectory rollout() returns."
        )
        return
    box.trajectory = trajectory


async def capture_yielded_trajectory(coroutine: Awaitable[Any]) -> Trajectory:
    """Await coroutine and return the trajectory it passed to yield_trajectory(); RuntimeError if none."""
    if not inspect.isawaitable(coroutine):
        raise TypeError(f"capture_yielded_trajectory takes a coroutine, not {type(coroutine).__name__}")
    box = YieldedTrajectory()
    token = yield_context.set(box)
    try:
        await coroutine
    finally:
        yield_context.reset(token)
    if box.trajectory is None:
        raise RuntimeError("No trajectory yielded: the coroutine never called art.yield_trajectory(trajectory).")
    return box.trajectory
