"""WebSocket consumers. Persist first, broadcast second: a client that (re)connects asks to catch up
from its cursors and gets what it missed from the database; the socket then carries only what is new."""

from __future__ import annotations

from datetime import timedelta

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.utils.dateparse import parse_datetime

from training.models import Run
from training.selectors import (
    GROUPS_SHOWN,
    checkpoint_rows,
    run_events_since,
    run_figures_get,
    run_logs_since,
    run_steps_since,
    run_visible,
    runs_by_id,
)
from training.selectors_queue import run_queue_place, run_queue_places
from training.services.broadcast import (
    checkpoint_message,
    event_message,
    log_message,
    queue_message,
    run_group_messages,
    run_group_name,
    run_row_message,
    run_summary,
    runs_list_group,
    step_message,
)
from training.services.runs import run_status_message

CATCH_UP_LIMIT = 2000
# Runs a runs-list page asks about at most: its largest page.
RUNS_CATCH_UP_LIMIT = 200
# A checkpoint's created_at is its worker's clock at the insert, which may precede the commit that made it
# visible: catch-up looks this much further back than the page's cursor (a row told twice is drawn once).
CHECKPOINT_CLOCK_MARGIN = timedelta(minutes=1)


def _cursor(content: dict, name: str) -> int:
    try:
        return int(content.get(name) or 0)
    except (TypeError, ValueError):
        return 0


def _since(content: dict, name: str):
    """A time cursor (ISO 8601, as the page got it from the server), less the clock margin; None if absent."""
    value = content.get(name)
    moment = parse_datetime(value) if isinstance(value, str) else None
    return moment - CHECKPOINT_CLOCK_MARGIN if moment is not None and moment.tzinfo is not None else None


def _ids(content: dict, name: str, limit: int) -> list[int]:
    value = content.get(name)
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, int) and not isinstance(v, bool)][:limit]


class _CatchUpConsumer(AsyncJsonWebsocketConsumer):
    """A socket in one group: it forwards the group's messages, and answers a `catch_up` request with
    what the page missed (`_catch_up`, read from the database)."""

    group: str

    async def join(self, group: str) -> None:
        self.group = group
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content, **kwargs):
        if content.get("type") == "catch_up":
            for message in await self._catch_up(content):
                await self.send_json(message)

    async def run_message(self, event):
        await self.send_json(event["message"])

    async def _catch_up(self, content: dict) -> list[dict]:
        raise NotImplementedError


class RunConsumer(_CatchUpConsumer):
    """ws/runs/<id>/: step metrics, status, events, log lines and group summaries of one run."""

    async def connect(self):
        user = self.scope.get("user")
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        if not user or not user.is_authenticated or not await self._can_see(user, self.run_id):
            await self.close(code=4403)
            return
        await self.join(run_group_name(self.run_id))

    @database_sync_to_async
    def _can_see(self, user, run_id: int) -> bool:
        return run_visible(user).filter(id=run_id).exists()

    @database_sync_to_async
    def _catch_up(self, content: dict) -> list[dict]:
        def cursor(name):
            return _cursor(content, name)

        run = run_figures_get(run_id=self.run_id)
        if run is None:
            return []
        # The status message, with the rest of the page's summary: every field the first paint showed.
        out = [{**run_status_message(run), **run_summary(run, checkpoints=run.checkpoint_count)}]
        if (place := run_queue_place(run=run)) is not None:
            out.append(queue_message(run.id, place))  # its place in the fair queue
        progress = {"steps_done": run.steps_done, "num_steps": run.num_steps}
        steps = run_steps_since(run=run, after_step=cursor("after_step"), limit=CATCH_UP_LIMIT)
        out += [step_message(s, **progress) for s in steps]
        out += [
            event_message(e) for e in run_events_since(run=run, after_id=cursor("after_event"), limit=CATCH_UP_LIMIT)
        ]
        out += [log_message(g) for g in run_logs_since(run=run, after_id=cursor("after_log"), limit=CATCH_UP_LIMIT)]
        # Groups newer than the page's, and again those it shows without advantages (they may have them now).
        out.extend(
            run_group_messages(
                run_id=self.run_id, after_id=cursor("after_group"), ids=_ids(content, "pending_groups", GROUPS_SHOWN)
            )
        )
        # Checkpoints written or deleted since the page's first paint (checkpoints_since: its time).
        if (since := _since(content, "checkpoints_since")) is not None:
            out += [checkpoint_message(c) for c in checkpoint_rows(run_id=self.run_id, since=since)]
        return out


class RunsConsumer(_CatchUpConsumer):
    """ws/runs/: new runs, status and progress, for the runs list.

    Joins the one runs-list group that carries the runs the user may see (training.services.broadcast),
    so only those ever reach the socket, and the consumer forwards without a query per message.
    """

    async def connect(self):
        user = self.scope.get("user")
        if not user or not user.is_authenticated:
            await self.close(code=4403)
            return
        self.user = user
        await self.join(runs_list_group(user))

    @database_sync_to_async
    def _catch_up(self, content: dict) -> list[dict]:
        """Rows of the runs the page shows (`runs`: their ids) and of runs created after its newest
        (`after_run`), newest last."""
        newer = list(
            run_visible(self.user)
            .filter(id__gt=_cursor(content, "after_run"))
            .order_by("-id")
            .values_list("id", flat=True)[:RUNS_CATCH_UP_LIMIT]
        )
        ids = set(newer) | set(_ids(content, "runs", RUNS_CATCH_UP_LIMIT))
        rows = [run_row_message(run) for run in runs_by_id(user=self.user, ids=ids).order_by("id")]
        # Their places in the fair queue: one read of the queue for all of them.
        places = run_queue_places() if any(row["status"] in Run.ACTIVE_STATUSES for row in rows) else {}
        return rows + [queue_message(row["run"], places[row["run"]]) for row in rows if row["run"] in places]
