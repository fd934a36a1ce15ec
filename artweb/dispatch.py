"""Sending Celery messages without losing the request that asked for them.

A row that needs a worker (a queued run, a dry run) is saved first; its message is published after the
commit. When the broker cannot be reached, the request still succeeds (the row is saved, queued) and the
row stays marked as not dispatched: the sweep that every worker runs (training.sweeper) publishes it
again once the broker is back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import transaction

logger = logging.getLogger(__name__)


def publish(task, *, args: tuple = (), kwargs: dict | None = None, **options) -> bool:
    """Send one task message; False (logged) when the broker cannot take it."""
    try:
        task.apply_async(args=args, kwargs=kwargs or {}, **options)
    except Exception:
        logger.warning(
            "could not send %s%s: the broker is unreachable; the sweep will send it again",
            task.name,
            tuple(args),
            exc_info=True,
        )
        return False
    return True


def publish_on_commit(
    task, *, args: tuple = (), kwargs: dict | None = None, sent: Callable[[], None] | None = None, **options
) -> None:
    """Publish after the current transaction commits; `sent` runs once the broker took the message."""

    def send() -> None:
        if publish(task, args=args, kwargs=kwargs, **options) and sent is not None:
            sent()

    transaction.on_commit(send)
