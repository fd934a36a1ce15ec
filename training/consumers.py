"""WebSocket consumers. Persist first, broadcast second: a client that (re)connects asks to catch up
from its cursors and gets what it missed from the database; the socket then carries only what is new."""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from training.services.broadcast import RUNS_GROUP, run_group_name

CATCH_UP_LIMIT = 2000


class RunConsumer(AsyncJsonWebsocketConsumer):
    """ws/runs/<id>/: step metrics, status, events, log lines and group summaries of one run."""

    async def connect(self):
        user = self.scope.get("user")
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        if not user or not user.is_authenticated or not await self._can_see(user, self.run_id):
            await self.close(code=4403)
            return
        self.group = run_group_name(self.run_id)
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

    @database_sync_to_async
    def _can_see(self, user, run_id: int) -> bool:
        from training.selectors import run_visible

        return run_visible(user).filter(id=run_id).exists()

    @database_sync_to_async
    def _catch_up(self, content: dict) -> list[dict]:
        from training.models import Run, RunEvent, RunLog, Step

        def cursor(name):
            try:
                return int(content.get(name) or 0)
            except (TypeError, ValueError):
                return 0

        out: list[dict] = []
        run = Run.objects.filter(id=self.run_id).values("status", "steps_done", "num_steps", "error").first()
        if run:
            out.append({"type": "status", "run": self.run_id, **run})
        for s in Step.objects.filter(run_id=self.run_id, step__gt=cursor("after_step")).order_by("step")[:CATCH_UP_LIMIT]:
            out.append({"type": "step", "step": s.step, "steps_done": run["steps_done"] if run else None,
                        "metrics": {**s.metrics, "reward_mean": s.reward_mean, "reward_std": s.reward_std,
                                    "val_reward": s.val_reward, "duration_s": s.duration_s}, "timings": s.timings})
        for e in RunEvent.objects.filter(run_id=self.run_id, id__gt=cursor("after_event")).order_by("id")[:CATCH_UP_LIMIT]:
            out.append({"type": "event", "id": e.id, "kind": e.kind, "message": e.message,
                        "created_at": e.created_at.isoformat()})
        for line in RunLog.objects.filter(run_id=self.run_id, id__gt=cursor("after_log")).order_by("id")[:CATCH_UP_LIMIT]:
            out.append({"type": "log", "id": line.id, "level": line.level, "message": line.message, "step": line.step,
                        "created_at": line.created_at.isoformat()})
        return out


class RunsConsumer(AsyncJsonWebsocketConsumer):
    """ws/runs/: status and progress of runs, for the runs list. Forwards only the user's own runs."""

    async def connect(self):
        user = self.scope.get("user")
        if not user or not user.is_authenticated:
            await self.close(code=4403)
            return
        self.user = user
        await self.channel_layer.group_add(RUNS_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        await self.channel_layer.group_discard(RUNS_GROUP, self.channel_name)

    async def run_message(self, event):
        message = event["message"]
        run_id = message.get("run")
        if run_id is not None and await self._can_see(run_id):
            await self.send_json(message)

    @database_sync_to_async
    def _can_see(self, run_id: int) -> bool:
        from training.selectors import run_visible

        return run_visible(self.user).filter(id=run_id).exists()
