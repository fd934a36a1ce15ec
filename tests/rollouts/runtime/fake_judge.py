"""An OpenAI-compatible judge server with known answers, for RULER tests that need no model.

It answers POST /v1/chat/completions with {"scores": [...]} built from `scores` (trajectory "1" gets
scores[0], and so on), or with `reply` verbatim when set; it records every request with the
Authorization header it came with. Runs on its own thread and loop, on a free port of 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from typing import Self

from aiohttp import web


class FakeJudge:
    def __init__(self, scores: list[float], *, reply: str | None = None, refuse_schema: bool = False) -> None:
        self.scores = list(scores)
        self.reply = reply
        self.refuse_schema = refuse_schema  # answer 400 to a request with a response_format, like some servers
        self.requests: list[dict] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="fake-judge")

    def __enter__(self) -> Self:
        self._thread.start()
        assert self._ready.wait(10), "the fake judge did not start"
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def trajectory_counts(self) -> list[int]:
        """How many trajectories each request asked about."""
        return [len(re.findall(r'<trajectory id="\d+">', r["body"]["messages"][-1]["content"]))
                for r in self.requests]

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._complete)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"body": body, "authorization": request.headers.get("Authorization")})
        if self.refuse_schema and "response_format" in body:
            return web.json_response({"error": {"message": "response_format is not supported", "type": "invalid_request_error",
                                                "param": None, "code": None}}, status=400)
        n = len(re.findall(r'<trajectory id="\d+">', body["messages"][-1]["content"]))
        content = self.reply if self.reply is not None else json.dumps({"scores": [
            {"trajectory_id": str(i + 1), "explanation": f"judged {i + 1} of {n}", "score": self.scores[i]}
            for i in range(n)]})
        return web.json_response({
            "id": "judge-1", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })
