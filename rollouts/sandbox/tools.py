"""What a run's tools need of the sandbox: the named hosts its agent may reach, the secrets it is given,
and the log of its connections.

Named hosts are "host" or "host:port" entries (HTTPS; port 443 when none is given) that join the batch's
egress list: the jail's CONNECT tunnel (rollouts.sandbox.tunnel) opens to them and to nothing else, and
only where the egress guard (rollouts.sandbox.egress) accepts them at that moment. Secrets are environment
variables of one batch's processes, never of the names the sandbox sets itself, and never written back:
every string of a result is scrubbed of their values. Each tunnel connection, made or refused, becomes a
line in the logs of the batch's rollouts and one entry of a summary for the run's timeline.

Pure: never imports Django.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from rollouts.sandbox.egress import (
    ALLOW_SETTING,
    DEFAULT_PORTS,
    PORTS_SETTING,
    EgressPolicy,
    address_refusal,
    target_key,
)

MAX_HOSTS = 20  # named hosts one run may list
HOSTS_PORT = 443  # the port of an entry that names none

# What the sandbox sets itself (rollouts.sandbox.process and the guest): a secret of that name would
# change how the sandbox works, or be overwritten by it.
SANDBOX_ENV = frozenset(
    {
        "PATH",
        "LANG",
        "HOME",
        "TMPDIR",
        "USER",
        "MALLOC_ARENA_MAX",
        "OMP_NUM_THREADS",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "HTTPS_PROXY",
        "HTTP_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
    }
)
SANDBOX_ENV_PREFIXES = ("ARTWEB_", "WANDB_", "WEAVE_", "WF_", "PYTHON", "LD_")
SECRET_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,99}")
_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")

MAX_LOGGED = 50  # connection lines added to a rollout's logs; the others are counted


def secret_name_problem(name: str) -> str | None:
    """Why `name` cannot be a secret's environment variable; None when it can."""
    if not SECRET_NAME.fullmatch(name or ""):
        return (
            f"{name!r} is not an environment variable name: use capital letters, digits and underscores, "
            "not starting with a digit, at most 100 characters, e.g. SEARCH_API_KEY."
        )
    if name in SANDBOX_ENV or name.startswith(SANDBOX_ENV_PREFIXES):
        return (
            f"{name} is set by the sandbox itself (it names the run's model, its proxy or the sandbox's own "
            f"settings: {', '.join(sorted(SANDBOX_ENV))} and names starting with "
            f"{', '.join(SANDBOX_ENV_PREFIXES)}); choose another name, e.g. SEARCH_API_KEY."
        )
    return None


def host_entry_check(entry: str, policy: EgressPolicy) -> str:
    """The "host:port" a named-host entry stands for (lower case, IPv6 in brackets); ValueError saying what to
    fix. Names are not resolved here: a name can be pointed elsewhere at any time, so the guard checks the
    address it resolves to on every connection. An IP literal is checked now, as the guard would."""
    raw = (entry or "").strip()
    example = "e.g. api.search.example or mcp.example.com:8443"
    if not raw:
        raise ValueError("an empty entry; remove it")
    if any(c in raw for c in "/?#@ ") or "://" in raw:
        raise ValueError(f"{raw!r} is not a host: give host or host:port without scheme, path or user, {example}")
    if raw.startswith("["):
        host, sep, rest = raw[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{raw!r} is not [IPv6]:port")
        port_text = rest[1:] if rest else ""
    elif raw.count(":") > 1:
        raise ValueError(f"{raw!r}: write an IPv6 address in brackets, e.g. [2001:db8::1]:443")
    else:
        host, _, port_text = raw.partition(":")
    host = host.rstrip(".").lower()
    if raw.endswith(":") or (port_text and not (port_text.isdigit() and 0 < int(port_text) < 65536)):
        raise ValueError(f"{raw!r} has no valid port: give a number from 1 to 65535, {example}")
    port = int(port_text) if port_text else HOSTS_PORT
    key = target_key(host, port)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
        if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in host.split(".")):
            raise ValueError(f"{raw!r} is not a valid host name, {example}") from None
    if policy.allows(host, port):
        return key
    if address is not None and (why := address_refusal(address)) is not None:
        raise ValueError(
            f"{host} is a {why} address: named hosts must be public. An operator can allow this host and port "
            f"with {ALLOW_SETTING}={key}."
        )
    if port not in DEFAULT_PORTS and port not in policy.allowed_ports:
        raise ValueError(
            f"port {port} of {host} is not allowed: named hosts use ports 443 and 80. An operator can allow more "
            f"ports with {PORTS_SETTING}, or this host and port alone with {ALLOW_SETTING}={key}."
        )
    return key


# --- the connection log ------------------------------------------------------------------------------


def _size(n: int) -> str:
    return f"{n} B" if n < 1000 else f"{n / 1000:.1f} kB" if n < 1_000_000 else f"{n / 1_000_000:.1f} MB"


def _where(c: dict) -> str:
    return f"{c['host']}:{c['port']}" if c.get("port") else (c.get("host") or "?")


def connection_line(c: dict) -> str:
    """One connection as a person reads it: where, whether it was made, bytes each way, how long."""
    where = _where(c)
    if c.get("allowed"):
        return (
            f"[artweb tunnel] {where}: connected, {_size(c['sent'])} sent, {_size(c['received'])} received, "
            f"{c['seconds']:.2f} s"
        )
    return f"[artweb tunnel] {where}: refused after {c['seconds']:.2f} s: {c.get('reason') or 'refused'}"


def connection_lines(connections: list[dict]) -> list[str]:
    """The lines each rollout of the batch gets. The batch's processes share one tunnel and a connection
    carries nothing that says which rollout opened it, so every rollout lists the whole batch's."""
    if not connections:
        return []
    lines = [
        f"[artweb tunnel] {len(connections)} HTTPS connection(s) of this batch (its rollouts share one tunnel, "
        "so each rollout lists them all):"
    ]
    lines += [connection_line(c) for c in connections[:MAX_LOGGED]]
    if len(connections) > MAX_LOGGED:
        lines.append(f"[artweb tunnel] … and {len(connections) - MAX_LOGGED} more (the run's timeline counts them)")
    return lines


def connections_summary(connections: Iterable[dict]) -> dict:
    """Per host: connections made, refused, bytes each way and seconds; and the totals. JSON-ready."""
    hosts: dict[str, dict] = {}
    reasons: dict[str, str] = {}
    for c in connections:
        where = _where(c)
        row = hosts.setdefault(where, {"connections": 0, "refused": 0, "sent": 0, "received": 0, "seconds": 0.0})
        row["connections" if c.get("allowed") else "refused"] += 1
        row["sent"] += c.get("sent", 0)
        row["received"] += c.get("received", 0)
        row["seconds"] = round(row["seconds"] + c.get("seconds", 0.0), 3)
        if not c.get("allowed"):
            reasons.setdefault(where, c.get("reason") or "refused")
    total = {k: sum(row[k] for row in hosts.values()) for k in ("connections", "refused", "sent", "received")}
    return {"hosts": hosts, **total, "refusals": reasons}


# --- secrets ------------------------------------------------------------------------------------------


SCRUBBED = "[secret]"


def scrubbed(value, secrets: Iterable[str]):
    """`value` (a result record, or any JSON-like value) with every occurrence of each secret replaced by
    SCRUBBED in every string, keys included: what a rollout printed or returned is stored and shown, a
    secret never. Longer secrets first, so that one containing another is replaced whole."""
    needles = sorted({s for s in secrets if s}, key=len, reverse=True)
    if not needles:
        return value

    def walk(v):
        if isinstance(v, str):
            for needle in needles:
                if needle in v:
                    v = v.replace(needle, SCRUBBED)
            return v
        if isinstance(v, dict):
            return {walk(k): walk(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x) for x in v]
        return v

    return walk(value)
