"""An OpenAI-compatible judge server with known answers, for RULER tests that need no model.

It answers POST /v1/chat/completions with {"scores": [...]} built from `scores` (trajectory "1" gets
scores[0], and so on), or with `reply` verbatim when set; it records every request with the
Authorization header it came with. Runs on its own thread and loop (ThreadedServer).
"""

from __future__ import annotations

import json
import re

from aiohttp import web

from tests.rollouts.sandbox.threaded_server import ThreadedServer


class FakeJudge(ThreadedServer):
    def __init__(self, scores: list[float], *, reply: str | None = None, refuse_schema: bool = False) -> None:
        super().__init__("fake-judge")
        self.scores = list(scores)
        self.reply = reply
        self.refuse_schema = refuse_schema  # answer 400 to a request with a response_format, like some servers
        self.requests: list[dict] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._complete)

    def trajectory_counts(self) -> list[int]:
        """How many trajectories each request asked about."""
        return [len(re.findall(r'<trajectory id="\d+">', r["body"]["messages"][-1]["content"])) for r in self.requests]

    async def _complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"body": body, "authorization": request.headers.get("Authorization")})
        if self.refuse_schema and "response_format" in body:
            return web.json_response(
                {
                    "error": {
                        "message": "response_format is not supported",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": None,
                    }
                },
                status=400,
            )
        n = len(re.findall(r'<trajectory id="\d+">', body["messages"][-1]["content"]))
        content = (
            self.reply
            if self.reply is not None
            else json.dumps(
                {
                    "scores": [
                        {"trajectory_id": str(i + 1), "explanation": f"judged {i + 1} of {n}", "score": self.scores[i]}
                        for i in range(n)
                    ]
                }
            )
        )
        return web.json_response(
            {
                "id": "judge-1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )
