"""The embedded services: a real PostgreSQL and a real Redis under a temporary data dir."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from artweb.launcher import BASE_DIR, single_launcher
from artweb.launcher.embedded import (
    EmbeddedPostgres,
    EmbeddedRedis,
    LaunchError,
    ServiceState,
    pid_alive,
    start_services,
    stop_services,
    wait_until,
)


def redis_ping(url: str) -> bool:
    host, port = url.removeprefix("redis://").split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=2) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(16).startswith(b"+PONG")


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def services_dir():
    # Not under tmp_path: as root, PostgreSQL runs as another user that must traverse the path, and a
    # concurrent pytest session resets the pytest-of-<user> directory to mode 0700.
    path = Path(tempfile.mkdtemp(prefix="artweb-launcher-test-"))
    yield path
    # Never leave a server behind, whatever the test did.
    for cls in (EmbeddedPostgres, EmbeddedRedis):
        service = cls(path / "services")
        if (state := ServiceState.read(service.state_file)) and service.is_server(state.pid):
            service.stop()
    shutil.rmtree(path, ignore_errors=True)


def test_it_starts_reuses_and_stops_the_embedded_services(services_dir):
    env = {}
    services = start_services(services_dir, env)
    assert [s.started for s in services] == [True, True]
    with psycopg.connect(env["DATABASE_URL"]) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("artweb",)
    assert redis_ping(env["REDIS_URL"])

    # A second launch finds both running and reuses them, same addresses, nothing started.
    env2 = {}
    reused = start_services(services_dir, env2)
    assert [s.started for s in reused] == [False, False]
    assert env2 == env

    pids = [s.state.pid for s in services]
    stop_services(services)
    assert not any(pid_alive(pid) for pid in pids)
    assert not any(s.state_file.exists() for s in services)


def test_it_keeps_the_data_across_restarts(services_dir):
    env = {}
    services = start_services(services_dir, {**env})
    pg = services[0]
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (v int)")
        conn.execute("INSERT INTO kept VALUES (42)")
    stop_services(services)

    pg = EmbeddedPostgres(services_dir / "services").start()
    assert pg.started
    with psycopg.connect(pg.url) as conn:
        assert conn.execute("SELECT v FROM kept").fetchone() == (42,)
    pg.stop()


def test_it_adopts_servers_whose_launcher_died(services_dir):
    redis = EmbeddedRedis(services_dir / "services").start()
    redis.state.owner = dead_pid()
    redis.state.write(redis.state_file)

    again = EmbeddedRedis(services_dir / "services").start()
    assert not again.started
    assert again.owned()  # so this launch stops it on exit
    again.stop()
    assert not pid_alive(redis.state.pid)


def test_it_leaves_a_server_alone_while_its_launcher_lives(services_dir):
    redis = EmbeddedRedis(services_dir / "services").start()
    other = EmbeddedRedis(services_dir / "services")
    other.state = ServiceState(pid=redis.state.pid, port=redis.state.port, owner=os.getppid())
    stop_services([other])
    assert pid_alive(redis.state.pid)
    redis.stop()


def test_it_uses_configured_services_instead(services_dir):
    env = {"DATABASE_URL": "postgres://postgres@db.example:5432/artweb", "REDIS_URL": "redis://r.example:6379/0"}
    assert start_services(services_dir, env) == []
    assert env["DATABASE_URL"] == "postgres://postgres@db.example:5432/artweb"
    assert not (services_dir / "services").exists()


def test_it_allows_one_launcher_per_data_dir(tmp_path):
    with single_launcher(tmp_path), pytest.raises(LaunchError, match="Another artweb launcher"), \
            single_launcher(tmp_path):
        pass


def test_services_mode_stops_everything_on_ctrl_c(services_dir):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["ARTWEB_DATA_DIR"] = str(services_dir)
    proc = subprocess.Popen([sys.executable, "-m", "artweb.launcher", "services"], cwd=BASE_DIR, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output = []
        for line in proc.stdout:
            output.append(line)
            if "Press Ctrl-C" in line:
                break
        assert "export DATABASE_URL=" in "".join(output), "".join(output)
        states = [ServiceState.read(cls(services_dir / "services").state_file)
                  for cls in (EmbeddedPostgres, EmbeddedRedis)]
        assert all(s and pid_alive(s.pid) for s in states)

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0
        assert wait_until(lambda: not any(pid_alive(s.pid) for s in states), timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
