"""Weave: rollout scripts decorate their own functions with @weave.op; artweb only hands the sandbox
what weave needs to trace them to the run's Weave project.

The step loop passes export_rollout_env(run=...) as RolloutRequest.env. The sandbox copies these
variables into the script's otherwise clean environment and, when WEAVE_PROJECT is set and weave is
importable, calls weave.init(WEAVE_PROJECT) before the script runs; otherwise `import weave` gives a
no-op stand-in, so a script with @weave.op runs the same with or without Weave.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from urllib.parse import urlsplit

from django.conf import settings

from rollouts.sandbox.egress import EgressRefused, egress_url_check
from rollouts.sandbox.tunnel import LocalEgressProxy
from training.exports.base import ExportError
from training.exports.schemas import export_settings_parse
from training.exports.selectors import export_target_secret, export_target_uses_worker_env, export_targets_for_run
from training.models import ExportTarget, Run

logger = logging.getLogger(__name__)

TEST_TIMEOUT_S = 45.0  # importing weave alone takes seconds; its retries against a bad server take more;
# below the clients' 60 s request timeout, so the person gets this answer rather than a timeout

# The variables a rollout sandbox passes through to user code for Weave (nothing else of the worker's env).
ROLLOUT_ENV_KEYS = (
    "WEAVE_PROJECT",
    "WANDB_API_KEY",
    "WANDB_BASE_URL",
    "WF_TRACE_SERVER_URL",
    "WANDB_MODE",
    "WANDB_DIR",
)


def weave_env(cfg, secret: str, *, worker_env: bool) -> dict[str, str]:
    """The variables weave needs to trace to the target's project; ExportError when there is no key.

    Only the operator's own targets (worker_env) fill a missing server from the worker's environment:
    these variables reach the run owner's code, so anyone else's target carries only what its owner stored.
    """
    if not secret:
        where = (
            "or set WANDB_API_KEY in the worker's environment"
            if worker_env
            else "(the Exports page, or `artweb exports edit ID --secret`)"
        )
        raise ExportError(f"Weave needs a W&B API key: enter one in the export settings {where}.")
    env = {"WEAVE_PROJECT": cfg.project, "WANDB_API_KEY": secret}
    base_url = cfg.base_url or (os.environ.get("WANDB_BASE_URL", "") if worker_env else "")
    if base_url:
        env["WANDB_BASE_URL"] = base_url
    if worker_env and os.environ.get("WF_TRACE_SERVER_URL"):
        env["WF_TRACE_SERVER_URL"] = os.environ["WF_TRACE_SERVER_URL"]
    return env


# Where weave sends traces unless told otherwise: W&B's API (project lookup) and its trace server.
DEFAULT_HOSTS = {"WANDB_BASE_URL": "https://api.wandb.ai", "WF_TRACE_SERVER_URL": "https://trace.wandb.ai"}


def rollout_egress_hosts(env: dict[str, str]) -> tuple[str, ...]:
    """The "host:port" pairs a jailed rollout may tunnel to for the run's own Weave project, and nothing
    else: the jail has no network, and the worker's proxy opens only these (rollouts.sandbox.proxy), and
    only where the egress guard allows them when the tunnel is opened (rollouts.sandbox.egress)."""
    if not env.get("WEAVE_PROJECT"):
        return ()
    hosts = []
    for key, default in DEFAULT_HOSTS.items():
        url = urlsplit(env.get(key) or default)
        if url.hostname:
            hosts.append(f"{url.hostname}:{url.port or (443 if url.scheme == 'https' else 80)}")
    return tuple(dict.fromkeys(hosts))


def export_rollout_env(*, run: Run) -> dict[str, str]:
    """Environment for the run's rollout sandboxes: {} unless the run has Weave configured with a key.

    Called on the GPU worker between steps, so it never raises: a broken Weave setting means rollouts
    run untraced (and the worker log says why), never a failed step.
    """
    try:
        target = next((t for t in export_targets_for_run(run=run) if t.kind == ExportTarget.Kind.WEAVE), None)
        if target is None:
            return {}
        return weave_env(
            export_settings_parse(target.kind, target.settings),
            export_target_secret(target),
            worker_env=export_target_uses_worker_env(target),
        )
    except Exception as exc:
        logger.warning("Weave settings unusable (%s); rollouts run untraced", exc, extra={"run_id": run.id})
        return {}


# The test process's only way out is the LocalEgressProxy named in HTTP(S)_PROXY, which connects where the
# egress guard allows: weave's HTTP clients take that proxy from the environment, and this audit hook,
# installed first, refuses any other connection the process tries (a client that ignored the proxy) and
# any program it would start.
EGRESS_ONLY = """
import os, sys
_PROXY = ("127.0.0.1", int(os.environ.pop("ARTWEB_EGRESS_PROXY_PORT")))

def _egress_only(event, args):
    if event == "socket.connect" and not (isinstance(args[1], tuple) and tuple(args[1][:2]) == _PROXY):
        raise PermissionError(f"a connection to {args[1]!r} outside artweb's egress proxy was refused")
    if event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn"):
        raise PermissionError(f"{event} was refused: the test process starts no program")

sys.addaudithook(_egress_only)
"""

# What the test runs: weave's own client, as a rollout script's @weave.op would use it. It prints one
# JSON line, so the answer is told apart from weave's own output.
_TEST_SCRIPT = (
    EGRESS_ONLY
    + """
import json
try:
    import weave
    client = weave.init(os.environ["WEAVE_PROJECT"])

    @weave.op
    def artweb_connection_test(message: str) -> str:
        return message

    artweb_connection_test("A test event sent from artweb's export settings.")
    client.flush()
except BaseException as exc:
    print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
    sys.exit(1)
print(json.dumps({"ok": True}))
"""
)


def weave_test_event(*, cfg, secret: str, worker_env: bool, timeout: float | None = None) -> str:
    """Trace one call of a @weave.op function to the target's project, in a process of its own with
    only weave_env's variables (as a rollout sandbox has them), so weave's global client and its retries
    stay out of the web server. Raises ExportError with weave's answer."""
    env = weave_env(cfg, secret, worker_env=worker_env)
    timeout = timeout or TEST_TIMEOUT_S
    server = env.get("WANDB_BASE_URL") or DEFAULT_HOSTS["WANDB_BASE_URL"]
    try:
        egress_url_check(server, settings.ARTWEB_EGRESS)  # a clear refusal now, rather than weave's retries
    except EgressRefused as exc:
        raise ExportError(f"Weave at {server} cannot be used: {exc}") from None
    with (
        tempfile.TemporaryDirectory(prefix="artweb-weave-test-") as home,
        LocalEgressProxy(settings.ARTWEB_EGRESS) as proxy,
    ):
        # A home of its own: no netrc or wandb settings of the server's account are read.
        env.update(
            PATH=os.environ.get("PATH", ""), HOME=home, WANDB_ERROR_REPORTING="false", WEAVE_PRINT_CALL_LINK="false"
        )
        env.update(dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"), proxy.url))
        env["ARTWEB_EGRESS_PROXY_PORT"] = str(proxy.port)
        try:
            out = subprocess.run(
                [sys.executable, "-c", _TEST_SCRIPT],
                env=env,
                cwd=home,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ExportError(
                f"Weave did not answer within {timeout:g} s; check the project and the server address."
            ) from exc
        refused = f" On the way out: {proxy.problems[0]}" if proxy.problems else ""
    result = next((json.loads(line) for line in reversed(out.stdout.splitlines()) if line.startswith("{")), None)
    if not result:
        raise ExportError(f"The Weave test did not finish: {(out.stderr or out.stdout).strip()[-500:]}{refused}")
    if not result["ok"]:
        raise ExportError(f"Weave refused the test trace: {result['error'][:500]}{refused}")
    return f"Weave accepted a test trace in {cfg.project}."
