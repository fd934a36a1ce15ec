"""Sending Celery messages without losing the request that asked for them.

A row that needs a worker (a queued run, a dry run) is saved first; its message is published after the
commit. When the broker cannot be reached, the request still succeeds (the row is saved, queued) and the
row stays marked as not dispatched: the sweep that every worker runs (training.sweeper) publishes it
again once the broker is back.

Tasks are named, not imported: a service that queues work does not import the tasks module that calls
it back, so tasks import services and never the other way round. Where the task is registered in this
process (every web and worker process), its own apply_async sends the message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from celery import current_app
from django.db import transaction

logger = logging.getLogger(__name__)


def send(task_name: str, *, args: tuple = (), kwargs: dict | None = None, **options) -> None:
    """Send one message to the task registered as task_name (routed by that name); raises when the broker
    cannot take it. A process that does not register the task sends the message by name all the same."""
    task = current_app.tasks.get(task_name)
    if task is not None:
        task.apply_async(args=args, kwargs=kwargs or {}, **options)
    else:
        current_app.send_task(task_name, args=args, kwargs=kwargs or {}, **options)


def publish(task_name: str, *, args: tuple = (), kwargs: dict | None = None, **options) -> bool:
    """Send one message to the task registered as task_name; False (logged) when the broker cannot take it."""
    try:
        send(task_name, args=args, kwargs=kwargs or {}, **options)
    except Exception:
        logger.warning(
            "could not send %s%s: the broker is unreachable; the sweep will send it again",
            task_name,
            tuple(args),
            exc_info=True,
        )
        return False
    return True


def publish_on_commit(
    task_name: str, *, args: tuple = (), kwargs: dict | None = None, sent: Callable[[], None] | None = None, **options
) -> None:
    """Publish after the current transaction commits; `sent` runs once the broker took the message."""

    def send_now() -> None:
        if publish(task_name, args=args, kwargs=kwargs, **options) and sent is not None:
            sent()

    transaction.on_commit(send_now)


# kombu's Redis transport keeps a queue with priorities as one list per priority step: "q", "q\x06\x163", …
PRIORITY_SEP = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)


def waiting_messages(queue: str) -> int | None:
    """How many messages wait in `queue` on the broker, not yet taken by a worker; None when the broker cannot
    say (unreachable, or not Redis)."""
    from django.conf import settings

    url = settings.CELERY_BROKER_URL
    if not url.startswith(("redis://", "rediss://")):
        return None
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        try:
            pipe = client.pipeline(transaction=False)
            for p in PRIORITY_STEPS:
                pipe.llen(queue if p == 0 else f"{queue}{PRIORITY_SEP}{p}")
            return sum(pipe.execute())
        finally:
            client.close()
    except redis.RedisError:
        logger.warning("the broker did not say how many messages wait in %s", queue, exc_info=True)
        return None
