"""`gather_trajectory_groups`: ART's way of running many groups of rollouts at once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from .trajectory import TrajectoryGroup


class TooManyExceptions(RuntimeError):
    pass


async def gather_trajectory_groups(
    groups: Iterable[TrajectoryGroup],
    pbar_desc: str | None = None,
    pbar_total_completion_tokens: bool = False,
    max_exceptions: float = 0,
    max_metrics: int | None = None,
    after_each: Any = None,
) -> list[TrajectoryGroup]:
    """Await every group concurrently; failed rollouts stay in each group's `exceptions`.

    max_exceptions: how many failed rollouts are tolerated in all (a float below 1 is a fraction of
    all rollouts); past that the call raises, as ART's does. The progress-bar arguments are accepted
    and ignored.
    """
    groups = list(groups)
    total = sum(len(g._pending) + len(g.trajectories) for g in groups)
    await asyncio.gather(*(group._gather() for group in groups))
    failed = [exc for group in groups for exc in group.exceptions]
    budget = max_exceptions * total if isinstance(max_exceptions, float) and max_exceptions < 1 else max_exceptions
    if len(failed) > budget:
        raise TooManyExceptions(f"{len(failed)} of {total} rollouts raised; the first: {failed[0]!r}") from failed[0]
    if after_each is not None:
        for group in groups:
            result = after_each(group)
            if asyncio.iscoroutine(result):
                await result
    return groups
