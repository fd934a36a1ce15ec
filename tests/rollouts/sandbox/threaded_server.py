"""An aiohttp application on a free port of 127.0.0.1, on a thread and event loop of its own: a real HTTP
peer for tests of code that calls an OpenAI-compatible server (the proxy's upstream, a RULER judge)."""

from __future__ import annotations

import asyncio
import threading
from typing import Self

from aiohttp import web


class ThreadedServer:
    """Subclasses add their routes in `routes`; `start()` returns once the port is listening."""

    def __init__(self, name: str) -> None:
        self.port: int | None = None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name=name)

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Self:
        self._thread.start()
        assert self._ready.wait(10), f"{self._thread.name} did not start"
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    async def _cleanup(self) -> None:
        await self._runner.cleanup()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        self.routes(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
