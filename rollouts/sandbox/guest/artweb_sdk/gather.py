"""ART's ways of running many rollouts at once: `gather_trajectory_groups`, `gather_trajectories` and
`trajectory_group_batches`.

Each counts the rollouts that raised against `max_exceptions` (a number, or a share of all rollouts when
between 0 and 1) as they fail, and raises TooManyExceptions once past it. ART draws a progress bar; in the
sandbox nobody watches one, so the progress-bar arguments are accepted and ignored.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from .trajectory import Trajectory, TrajectoryGroup


class TooManyExceptions(RuntimeError):
    pass


class ExceptionBudget:
    """The failures allowed among `total` rollouts: max_exceptions of them, or that share of `total` when
    0 < max_exceptions < 1 (ART's rule)."""

    def __init__(self, max_exceptions: float, total: int) -> None:
        self.max_exceptions = max_exceptions
        self.total = max(1, total)
        self.failures: list[BaseException] = []

    def charge(self, failures: list[BaseException]) -> None:
        self.failures.extend(failures)
        if self.exceeded():
            first = self.failures[0]
            raise TooManyExceptions(
                f"{len(self.failures)} of {self.total} rollouts raised, more than max_exceptions="
                f"{self.max_exceptions} allows; the first: {first!r}"
            ) from first

    def exceeded(self) -> bool:
        failed = len(self.failures)
        if 0 < self.max_exceptions < 1 and failed / self.total <= self.max_exceptions:
            return False
        return failed > self.max_exceptions

    def reset(self) -> None:
        self.failures = []


def group_size(item: Any) -> int:
    """The rollouts an item of gather_trajectory_groups stands for: a group's, or 1 for a coroutine."""
    return item.size if isinstance(item, TrajectoryGroup) else 1


async def settle_group(item: Any, budget: ExceptionBudget) -> TrajectoryGroup | None:
    """A TrajectoryGroup, or an awaitable of one (a coroutine that builds a group), run to its end.

    The group's rollouts that raised stay in its `exceptions` and are charged to the budget; an awaitable
    that raised is charged as one failure and gives None (the group is dropped), as in ART.
    """
    if isinstance(item, TrajectoryGroup):
        group, counted = item, len(item.exceptions)
    elif inspect.isawaitable(item):
        try:
            group = await item
        except Exception as exc:
            budget.charge([exc])
            return None
        if not isinstance(group, TrajectoryGroup):
            raise TypeError(f"a group's awaitable returned {type(group).__name__}, not an art.TrajectoryGroup")
        counted = 0  # what failed while the coroutine awaited its own group counts too
    else:
        raise TypeError(f"expected art.TrajectoryGroup objects or awaitables of them, not {type(item).__name__}")
    await group._gather()
    budget.charge(group.exceptions[counted:])
    return group


async def gather_trajectory_groups(
    groups: Iterable[TrajectoryGroup | Awaitable[TrajectoryGroup]],
    *,
    pbar_desc: str | None = "gather",
    pbar_total_completion_tokens: bool = False,
    max_exceptions: float = 0,
    max_metrics: int | None = None,
    after_each: Callable[[TrajectoryGroup], Any] | None = None,
) -> list[TrajectoryGroup]:
    """Await every group concurrently; failed rollouts stay in each group's `exceptions`.

    groups: TrajectoryGroups, or awaitables that return one (a coroutine that raises drops its group).
    after_each: called on each finished group (awaited if it returns an awaitable); what it returns takes
    the group's place: a group, a list of groups, or None to drop it.
    """
    groups = list(groups)
    budget = ExceptionBudget(max_exceptions, sum(group_size(g) for g in groups))

    async def forward(item: Any) -> Any:
        group = await settle_group(item, budget)
        if group is None or after_each is None:
            return group
        result = after_each(group)
        return await result if inspect.isawaitable(result) else result

    gathered = []
    for result in await asyncio.gather(*(forward(g) for g in groups)):
        gathered.extend(_groups_from(result))
    return gathered


def _groups_from(result: Any) -> list[TrajectoryGroup]:
    if result is None:
        return []
    candidates = result if isinstance(result, list) else [result]
    for candidate in candidates:
        if not isinstance(candidate, TrajectoryGroup):
            raise TypeError(
                "after_each must return an art.TrajectoryGroup, a list of them, or None to drop the group; "
                f"it returned {type(candidate).__name__}"
            )
    return candidates


async def gather_trajectories(
    trajectories: Iterable[Awaitable[Any]],
    *,
    pbar_desc: str | None = "gather",
    pbar_total_completion_tokens: bool = False,
    max_exceptions: float = 0,
) -> list[Any]:
    """Await rollouts concurrently, in order: each gives a Trajectory (or a list, when it returns several).

    A rollout that raised within max_exceptions leaves its exception in its place in the list.
    """
    awaitables = list(trajectories)
    budget = ExceptionBudget(max_exceptions, len(awaitables))

    async def one(awaitable: Awaitable[Any]) -> Any:
        try:
            result = await awaitable
        except Exception as exc:
            budget.charge([exc])
            return exc
        if isinstance(result, Trajectory):
            return result
        items = list(result)
        for item in items:
            if not isinstance(item, Trajectory):
                raise TypeError(f"a rollout returned {type(item).__name__} among its trajectories")
        return items

    return list(await asyncio.gather(*(one(a) for a in awaitables)))


async def trajectory_group_batches(
    groups: Iterable[TrajectoryGroup | Awaitable[TrajectoryGroup]],
    *,
    batch_size: int,
    max_batch_exceptions: float = 0,
    max_concurrent_batches: int = 4,
    skip_batches: int = 0,
    pbar_desc: str | None = "batches",
    pbar_total_completion_tokens: bool = False,
) -> AsyncIterator[list[TrajectoryGroup]]:
    """Yield lists of batch_size finished groups, in the order they finish (the last list may be shorter).

    At most batch_size * max_concurrent_batches groups run at once; the first batch_size * skip_batches
    groups are skipped (resuming); max_batch_exceptions counts per batch.
    """
    if batch_size < 1 or max_concurrent_batches < 1:
        raise ValueError("batch_size and max_concurrent_batches must be at least 1")
    waiting = list(groups)
    for skipped in waiting[: batch_size * skip_batches]:
        if inspect.iscoroutine(skipped):
            skipped.close()  # never awaited: closing it spares Python's "never awaited" warning
    waiting = waiting[batch_size * skip_batches :]
    budget = ExceptionBudget(max_batch_exceptions, batch_size)
    running: set[asyncio.Future] = set()
    batch: list[TrajectoryGroup] = []
    try:
        while waiting or running:
            while waiting and len(running) < batch_size * max_concurrent_batches:
                running.add(asyncio.ensure_future(settle_group(waiting.pop(0), budget)))
            done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            batch.extend(group for task in done if (group := task.result()) is not None)
            while len(batch) >= batch_size:
                ready, batch = batch[:batch_size], batch[batch_size:]
                budget.reset()
                yield ready
        if batch:
            yield batch
    finally:
        for task in running:
            task.cancel()
