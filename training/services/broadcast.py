"""Messages to a run's WebSocket group, sent only after the transaction that wrote them commits."""

from __future__ import annotations

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction


def run_group_name(run_id: int) -> str:
    return f"run_{run_id}"


RUNS_GROUP = "runs"


def broadcast_now(group: str, message: dict) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, {"type": "run.message", "message": message})
    except Exception:  # noqa: BLE001 - a broadcast is best effort; the database is the record
        import logging

        logging.getLogger(__name__).warning("broadcast to %s failed", group, exc_info=True)


def run_broadcast(run_id: int, message: dict, *, to_list: bool = False) -> None:
    """Queue a message for the run's group (and the runs-list group) after commit."""

    def send():
        broadcast_now(run_group_name(run_id), message)
        if to_list:
            broadcast_now(RUNS_GROUP, message)

    transaction.on_commit(send)
