"""The embedded services: a real PostgreSQL and a real Redis under a temporary data dir."""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest
import redis

from artweb.launcher import (
    BASE_DIR,
    allowed_hosts_for,
    launch_env,
    single_launcher,
    tighten_data_dir,
    web_command,
)
from artweb.launcher.embedded import (
    CREDENTIALS_FILE,
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
    with redis.Redis.from_url(url, socket_timeout=3) as client:
        return client.ping()


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


@pytest.mark.slow  # starts PostgreSQL and Redis
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


def without_password(url: str) -> str:
    scheme, _, rest = url.partition("://")
    userinfo, _, host = rest.rpartition("@")
    user = userinfo.split(":")[0]
    return f"{scheme}://{user + '@' if user else ''}{host}"


def assert_password_required(env: dict) -> None:
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(without_password(env["DATABASE_URL"]), connect_timeout=3)
    with psycopg.connect(env["DATABASE_URL"]) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
    with pytest.raises(redis.AuthenticationError):
        redis_ping(without_password(env["REDIS_URL"]))
    assert redis_ping(env["REDIS_URL"])


@pytest.mark.slow  # starts PostgreSQL and Redis
def test_it_requires_generated_passwords_kept_in_a_private_file(services_dir):
    env = {}
    services = start_services(services_dir, env)
    credentials = services_dir / "services" / CREDENTIALS_FILE
    assert credentials.stat().st_mode & 0o777 == 0o600
    passwords = json.loads(credentials.read_text())
    assert set(passwords) == {"postgres", "redis"} and all(len(p) >= 40 for p in passwords.values())
    assert f":{passwords['postgres']}@" in env["DATABASE_URL"] and f":{passwords['redis']}@" in env["REDIS_URL"]
    assert_password_required(env)
    stop_services(services)


@pytest.mark.slow  # starts PostgreSQL and Redis
def test_it_gives_passwords_to_servers_an_earlier_version_left_without_one(services_dir):
    env = {}
    pg, red = start_services(services_dir, env)
    # What an earlier version left: servers that let anyone on the machine in, and no credentials file.
    (pg.pgdata / "pg_hba.conf").write_text("host all all 127.0.0.1/32 trust\n")
    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as conn:
        conn.execute("SELECT pg_reload_conf()")
    with redis.Redis.from_url(env["REDIS_URL"]) as client:
        client.config_set("requirepass", "")
    (services_dir / "services" / CREDENTIALS_FILE).unlink()
    assert psycopg.connect(without_password(env["DATABASE_URL"])).close() is None
    assert redis_ping(without_password(env["REDIS_URL"]))

    # Running: the next launch reuses them and applies new passwords.
    env2 = {}
    reused = start_services(services_dir, env2)
    assert [s.started for s in reused] == [False, False] and env2 != env
    assert_password_required(env2)

    # Stopped: the cluster gets its password before it listens.
    stop_services([pg, red])
    (pg.pgdata / "pg_hba.conf").write_text("host all all 127.0.0.1/32 trust\n")
    (services_dir / "services" / CREDENTIALS_FILE).unlink()
    env3 = {}
    services = start_services(services_dir, env3)
    assert [s.started for s in services] == [True, True]
    assert_password_required(env3)
    stop_services(services)


@pytest.mark.slow  # starts PostgreSQL and Redis
def test_it_keeps_the_data_across_restarts(services_dir):
    env = {}
    services = start_services(services_dir, {**env})
    pg = services[0]
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (v int)")
        conn.execute("INSERT INTO kept VALUES (42)")
    stop_services(services)

    again = EmbeddedPostgres(services_dir / "services").start()
    assert again.started and again.password == pg.password
    with psycopg.connect(again.url) as conn:
        assert conn.execute("SELECT v FROM kept").fetchone() == (42,)
    again.stop()


@pytest.mark.slow  # starts PostgreSQL and Redis
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
    with (
        single_launcher(tmp_path),
        pytest.raises(LaunchError, match="Another artweb launcher"),
        single_launcher(tmp_path),
    ):
        pass


@pytest.mark.slow  # starts PostgreSQL and Redis
def test_services_mode_stops_everything_on_ctrl_c(services_dir):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["ARTWEB_DATA_DIR"] = str(services_dir)
    proc = subprocess.Popen(
        [sys.executable, "-m", "artweb.launcher", "services"],
        cwd=BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output = []
        for line in proc.stdout:
            output.append(line)
            if "Press Ctrl-C" in line:
                break
        assert "export DATABASE_URL=" in "".join(output), "".join(output)
        # The launcher's umask: what it and the servers create is private.
        assert services_dir.stat().st_mode & 0o777 in (0o700, 0o711)  # 0711 as root: see tighten_data_dir
        assert (services_dir / "services" / "redis" / "redis.log").stat().st_mode & 0o077 == 0
        states = [
            ServiceState.read(cls(services_dir / "services").state_file) for cls in (EmbeddedPostgres, EmbeddedRedis)
        ]
        assert all(s and pid_alive(s.pid) for s in states)

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0
        assert wait_until(lambda: not any(pid_alive(s.pid) for s in states), timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_it_makes_an_existing_data_dir_private_without_walking_the_big_trees(tmp_path):
    data = tmp_path / "data"
    for path in (data / "uploads", data / "models" / "m", data / "services" / "redis"):
        path.mkdir(parents=True, mode=0o755)
    for path in (
        data / "uploads" / "s.jsonl",
        data / "models" / "m" / "weights.bin",
        data / "services" / "redis" / "dump.rdb",
    ):
        path.write_text("x")
        path.chmod(0o644)
    data.chmod(0o755)

    tighten_data_dir(data)

    def mode(path):
        return path.stat().st_mode & 0o777

    assert mode(data) == 0o700
    assert mode(data / "uploads") == mode(data / "models") == mode(data / "services") == 0o700
    assert mode(data / "services" / "redis") == 0o700 and mode(data / "services" / "redis" / "dump.rdb") == 0o600
    # Behind a 0700 folder: left as they were, however large the tree.
    assert mode(data / "models" / "m") == 0o755 and mode(data / "uploads" / "s.jsonl") == 0o644


def test_it_keeps_one_random_secret_key_in_the_data_dir_and_passes_it_on(tmp_path):
    env = launch_env({}, tmp_path, host="127.0.0.1")
    key_file = tmp_path / "secret_key"
    assert env["SECRET_KEY"] == key_file.read_text().strip() and len(env["SECRET_KEY"]) >= 50
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert launch_env({}, tmp_path, host="127.0.0.1")["SECRET_KEY"] == env["SECRET_KEY"]  # kept
    assert launch_env({"SECRET_KEY": "set-by-the-operator"}, tmp_path, host="127.0.0.1")["SECRET_KEY"] == (
        "set-by-the-operator"
    )
    assert "DEBUG" not in env and env["LOG_FORMAT"] == "console"


def test_it_answers_to_the_names_of_the_address_it_listens_on(tmp_path):
    loopback = ["localhost", "127.0.0.1", "[::1]"]
    assert allowed_hosts_for("127.0.0.1") == allowed_hosts_for("::1") == loopback
    assert allowed_hosts_for("127.0.0.2") == [*loopback, "127.0.0.2"]
    assert allowed_hosts_for("192.0.2.10") == ["192.0.2.10"]
    assert allowed_hosts_for("0.0.0.0")[:3] == loopback and len(allowed_hosts_for("0.0.0.0")) == 4
    assert launch_env({}, tmp_path, host="127.0.0.1")["ALLOWED_HOSTS"] == "localhost,127.0.0.1,[::1]"
    assert launch_env({"ALLOWED_HOSTS": "art.example"}, tmp_path, host="0.0.0.0")["ALLOWED_HOSTS"] == "art.example"


def test_the_web_server_believes_forwarded_headers_only_from_listed_proxies():
    plain = web_command({}, host="127.0.0.1", port=8000, python="python")
    assert plain[:4] == ["python", "-m", "uvicorn", "artweb.asgi:application"]
    assert "--no-proxy-headers" in plain and "--forwarded-allow-ips" not in plain
    # Even with uvicorn's own variable set: the launcher's setting decides.
    behind = web_command(
        {"ARTWEB_TRUSTED_PROXIES": " 10.0.0.1, 10.1.0.0/16 ", "FORWARDED_ALLOW_IPS": "*"}, host="0.0.0.0", port=8000
    )
    i = behind.index("--forwarded-allow-ips")
    assert behind[i - 1] == "--proxy-headers" and behind[i + 1] == "10.0.0.1,10.1.0.0/16"
