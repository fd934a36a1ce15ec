"""The one egress guard: every connection artweb makes on a user's behalf goes through here.

Export targets and their test events, judge endpoints, the jail's HTTPS tunnels: each names a host that a
user chose, and the worker or the web process connects from its own network. So before each new
connection the name is resolved once, every address it resolves to must be public, and the connection
goes to one of those very addresses, never to a second lookup's answer (a name that answers a public
address to the check and 127.0.0.1 to the connect, "DNS rebinding", gains nothing). Loopback, private,
link-local, CGNAT, multicast, reserved, IPv4-mapped or -translated and unique-local addresses are refused
unless the operator allows that exact host:port (ARTWEB_EGRESS_ALLOW); ports other than 443 and 80 unless
the operator allows them (ARTWEB_EGRESS_PORTS). Redirects are never followed: a 3xx reaches the caller as
an error naming it.

What callers get: egress_resolve (the check), egress_connect / egress_open_connection (a TCP connection to
a checked address), egress_client / egress_async_client (httpx clients whose every connection is checked
and pinned, TLS still verified against the name), egress_connector (the same for aiohttp) and
egress_url_check (the check of a URL a person saves, for a clear form error). Pure: never imports Django.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpcore
import httpx

ALLOW_SETTING = "ARTWEB_EGRESS_ALLOW"
PORTS_SETTING = "ARTWEB_EGRESS_PORTS"
DEFAULT_PORTS = frozenset({443, 80})

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Ranges refused by name, before the ipaddress module's properties: those it calls global although no
# public server lives there (multicast, site-local, NAT64 and 6to4, which embed an IPv4 address such as
# 127.0.0.1, IPv4-compatible IPv6, documentation), and those worth naming precisely in a refusal.
NAMED_RANGES: tuple[tuple[str, str], ...] = (
    ("100.64.0.0/10", "carrier-grade NAT (shared address space, RFC 6598)"),
    ("169.254.0.0/16", "link-local (cloud metadata services answer at 169.254.169.254)"),
    ("192.0.0.0/24", "IETF protocol assignment"),
    ("192.0.2.0/24", "documentation"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("198.18.0.0/15", "benchmarking"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("240.0.0.0/4", "reserved"),
    ("0.0.0.0/8", '"this network"'),
    ("::ffff:0:0/96", "IPv4-mapped IPv6"),
    ("::/96", "IPv4-compatible IPv6"),
    ("64:ff9b::/96", "IPv4/IPv6-translated (NAT64)"),
    ("64:ff9b:1::/48", "IPv4/IPv6-translated (local NAT64)"),
    ("2002::/16", "6to4 (an IPv4 address inside IPv6)"),
    ("2001::/32", "Teredo (an IPv4 address inside IPv6)"),
    ("2001:db8::/32", "documentation"),
    ("3fff::/20", "documentation"),
    ("2001:2::/48", "benchmarking"),
    ("100::/64", "discard-only"),
    ("fc00::/7", "unique-local IPv6"),
    ("fec0::/10", "site-local IPv6"),
    ("fe80::/10", "link-local IPv6"),
)
_NAMED = tuple((ipaddress.ip_network(net), what) for net, what in NAMED_RANGES)


class EgressRefused(Exception):
    """A connection the guard will not make; the message says what was refused and which setting allows it.

    Not an OSError on purpose: client libraries turn OSErrors into their own "cannot connect" errors and
    retries, and this answer should reach the person as it is."""


class EgressRedirect(EgressRefused):
    """An upstream answered 3xx. Following it would connect somewhere nobody checked when the URL was saved."""


@dataclass(frozen=True)
class EgressPolicy:
    """What the operator allows beyond public addresses on ports 443 and 80.

    allowed_hosts: "host:port" entries ("[::1]:8080" for IPv6) that may resolve to any address, loopback
    and private ones included, on exactly that port. allowed_ports: more ports any public host may use."""

    allowed_hosts: frozenset[str] = frozenset()
    allowed_ports: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, hosts: Iterable[str] = (), ports: Iterable[int | str] = ()) -> EgressPolicy:
        """From the settings' lists; ValueError naming the setting and the bad entry."""
        allowed = set()
        for entry in hosts:
            entry = entry.strip()
            if not entry:
                continue
            host, _, port = entry.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{ALLOW_SETTING}: {entry!r} is not host:port, e.g. wandb.internal:8080 or [::1]:8080")
            allowed.add(target_key(host, int(port)))
        numbers = set()
        for port in ports:
            if not str(port).strip().isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{PORTS_SETTING}: {port!r} is not a port number between 1 and 65535")
            numbers.add(int(port))
        return cls(frozenset(allowed), frozenset(numbers))

    def allows(self, host: str, port: int) -> bool:
        return target_key(host, port) in self.allowed_hosts


def target_key(host: str, port: int) -> str:
    """host:port as policies store it: lower case, no brackets or trailing dot, IPv6 in brackets."""
    host = host.strip().strip("[]").rstrip(".").lower()
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        pass
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def address_refusal(address: IPAddress) -> str | None:
    """Why an address is not one to connect to on a user's behalf ("loopback", ...); None for public ones."""
    if address.is_loopback:
        return "loopback"
    if address.is_unspecified:
        return "unspecified"
    for network, what in _NAMED:
        if address.version == network.version and address in network:
            return what
    if address.is_multicast:
        return "multicast"
    if address.is_link_local:
        return "link-local"
    if address.is_private:
        return "private network"
    if address.is_reserved:
        return "reserved"
    if not address.is_global:
        return "not publicly routable"
    return None


def _port_refusal(host: str, port: int, policy: EgressPolicy) -> str | None:
    if port in DEFAULT_PORTS or port in policy.allowed_ports:
        return None
    return (
        f"Port {port} of {host} is not allowed: connections made on a user's behalf use ports 443 and 80. "
        f"An operator can allow more ports with {PORTS_SETTING}, or this host and port alone with "
        f"{ALLOW_SETTING}={target_key(host, port)}."
    )


def _addresses(host: str, infos: list) -> list[str]:
    out = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and sockaddr[0] not in out:
            out.append(sockaddr[0])
    if not out:
        raise EgressRefused(f"{host} has no IPv4 or IPv6 address to connect to.")
    return out


def _check(host: str, port: int, addresses: list[str], policy: EgressPolicy) -> list[str]:
    if policy.allows(host, port):
        return addresses
    for text in addresses:
        why = address_refusal(ipaddress.ip_address(text.split("%", 1)[0]))
        if why is not None:
            shown = host if host == text else f"{host} resolves to {text}, which"
            article = "an" if why[0] in "aeiouIU" else "a"
            raise EgressRefused(
                f"{shown} is {article} {why} address: artweb connects on a user's behalf only to public addresses. "
                f"An operator can allow this host and port with {ALLOW_SETTING}={target_key(host, port)}."
            )
    if (why := _port_refusal(host, port, policy)) is not None:
        raise EgressRefused(why)
    return addresses


def _host(host: str) -> str:
    host = (host or "").strip().strip("[]").rstrip(".")
    if not host:
        raise EgressRefused("No host was given to connect to.")
    return host


def _unresolved(host: str, exc: Exception) -> EgressRefused:
    return EgressRefused(f"{host} cannot be resolved ({exc}).")


def egress_resolve(host: str, port: int, policy: EgressPolicy) -> list[str]:
    """The addresses host:port may be reached at, every one checked; EgressRefused otherwise.

    Connect only to what this returns, and call it again for every new connection."""
    host = _host(host)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        raise _unresolved(host, exc) from None
    return _check(host, port, _addresses(host, infos), policy)


async def egress_resolve_async(host: str, port: int, policy: EgressPolicy) -> list[str]:
    """egress_resolve without blocking the event loop."""
    host = _host(host)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except (OSError, UnicodeError) as exc:
        raise _unresolved(host, exc) from None
    return _check(host, port, _addresses(host, infos), policy)


def egress_connect(host: str, port: int, policy: EgressPolicy, *, timeout: float = 30.0) -> socket.socket:
    """A TCP connection to a checked address of host:port (the first that answers)."""
    last: OSError | None = None
    for address in egress_resolve(host, port, policy):
        try:
            return socket.create_connection((address, port), timeout=timeout)
        except OSError as exc:
            last = exc
    assert last is not None
    raise last


async def egress_open_connection(
    host: str, port: int, policy: EgressPolicy, *, timeout: float = 30.0, limit: int = 1 << 16
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """asyncio streams over a TCP connection to a checked address of host:port."""
    last: BaseException | None = None
    for address in await egress_resolve_async(host, port, policy):
        try:
            return await asyncio.wait_for(asyncio.open_connection(address, port, limit=limit), timeout)
        except (OSError, TimeoutError) as exc:
            last = exc
    assert last is not None
    raise last


def url_target(url: str) -> tuple[str, int]:
    """(host, port) of an http(s) URL; EgressRefused for anything else, or one carrying a user or password."""
    parts = urlsplit((url or "").strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EgressRefused(f"{url!r} is not an http:// or https:// URL.")
    if parts.username is not None or parts.password is not None:
        raise EgressRefused("The URL may not carry a user or password; keys go in the key field.")
    try:
        port = parts.port
    except ValueError:
        raise EgressRefused(f"{url!r} has no valid port.") from None
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def egress_url_check(url: str, policy: EgressPolicy) -> tuple[str, int]:
    """The check a URL gets when a person saves it, for an error at once. Not the one that counts: a name
    can be pointed elsewhere afterwards, so every connection is checked again when it is made."""
    host, port = url_target(url)
    if not policy.allows(host, port):  # the operator vouched for that one, resolvable from here or not
        egress_resolve(host, port, policy)
    return host, port


def redirect_error(what: str, status: int, reason: str, location: str | None) -> EgressRedirect:
    """The error a 3xx becomes: names the redirect and where it led, never the answer's body."""
    where = ""
    if location:
        target = urlsplit(location)
        where = f", a redirect to {target.hostname}" if target.hostname else ", a redirect on the same server"
    return EgressRedirect(
        f"{what} answered HTTP {status} {reason}{where}; redirects are not followed on a user's behalf: "
        "give the final URL instead."
    )


def failure_reason(exc: BaseException) -> str:
    """Why a connection failed, in words that carry nothing the other side sent (a protocol error's message
    quotes the bytes it could not parse): the error's type, and the operating system's words for an OSError
    behind it."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno:
            return f"{type(exc).__name__}: {os.strerror(cause.errno)}"
        cause = cause.__cause__ or cause.__context__
    return type(exc).__name__


# --- httpx ----------------------------------------------------------------------------------------------


class _Backend(httpcore.NetworkBackend):
    """httpcore opens every connection here: the name is checked, the socket goes to a checked address,
    and httpcore then starts TLS with the name (SNI and certificate check) as it would have anyway."""

    def __init__(self, policy: EgressPolicy) -> None:
        self._policy = policy
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        last: Exception | None = None
        for address in egress_resolve(host, port, self._policy):
            try:
                return self._inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise EgressRefused("Unix sockets are not reachable on a user's behalf.")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _AsyncBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, policy: EgressPolicy) -> None:
        self._policy = policy
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        last: Exception | None = None
        for address in await egress_resolve_async(host, port, self._policy):
            try:
                return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last

    async def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise EgressRefused("Unix sockets are not reachable on a user's behalf.")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


@functools.cache
def _tls_context():
    """httpx's default TLS context (certificates verified), built once: loading the CA bundle takes ~50 ms."""
    return httpx.create_ssl_context()


class EgressTransport(httpx.HTTPTransport):
    def __init__(self, policy: EgressPolicy) -> None:
        super().__init__(verify=_tls_context(), trust_env=False)
        # httpx has no public argument for httpcore's network backend, so its pool is replaced with one
        # that has ours; test_egress checks that a connection through this transport is still refused.
        self._pool = httpcore.ConnectionPool(ssl_context=_tls_context(), network_backend=_Backend(policy))


class AsyncEgressTransport(httpx.AsyncHTTPTransport):
    def __init__(self, policy: EgressPolicy) -> None:
        super().__init__(verify=_tls_context(), trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(ssl_context=_tls_context(), network_backend=_AsyncBackend(policy))


def _redirect_of(response: httpx.Response) -> EgressRedirect | None:
    if not 300 <= response.status_code < 400:
        return None
    return redirect_error(
        response.request.url.host, response.status_code, response.reason_phrase, response.headers.get("location")
    )


def _refuse_redirect(response: httpx.Response) -> None:
    if (error := _redirect_of(response)) is not None:
        response.close()
        raise error


async def _refuse_redirect_async(response: httpx.Response) -> None:
    if (error := _redirect_of(response)) is not None:
        await response.aclose()
        raise error


def egress_client(policy: EgressPolicy, **kwargs) -> httpx.Client:
    """An httpx.Client whose every connection goes through the guard; a 3xx raises EgressRedirect.

    kwargs: httpx.Client's own (base_url, auth, timeout, headers), but not transport, mounts, proxies or
    follow_redirects, which would route around the guard. The environment's proxy settings are ignored."""
    _refuse_routing(kwargs)
    return httpx.Client(
        transport=EgressTransport(policy),
        follow_redirects=False,
        trust_env=False,
        event_hooks={"response": [_refuse_redirect]},
        **kwargs,
    )


def egress_async_client(policy: EgressPolicy, **kwargs) -> httpx.AsyncClient:
    """egress_client for asyncio."""
    _refuse_routing(kwargs)
    return httpx.AsyncClient(
        transport=AsyncEgressTransport(policy),
        follow_redirects=False,
        trust_env=False,
        event_hooks={"response": [_refuse_redirect_async]},
        **kwargs,
    )


def _refuse_routing(kwargs: dict) -> None:
    for name in ("transport", "mounts", "proxy", "proxies", "follow_redirects", "trust_env", "event_hooks", "uds"):
        if name in kwargs:
            raise TypeError(f"{name} cannot be given to an egress client: it would route around the guard")


# --- aiohttp ----------------------------------------------------------------------------------------------


@functools.cache
def _connector_class():
    # aiohttp is imported only by processes that use it (the worker's proxy), not by the web server.
    import aiohttp

    class EgressConnector(aiohttp.TCPConnector):
        """Every connection's host goes through the guard, IP literals included (aiohttp's resolver is
        skipped for those, so the check is on _resolve_host, which every direct connection calls)."""

        def __init__(self, policy: EgressPolicy, **kwargs) -> None:
            super().__init__(use_dns_cache=False, **kwargs)
            self.egress_policy = policy

        async def _resolve_host(self, host: str, port: int, traces=None) -> list[dict]:
            addresses = await egress_resolve_async(host, port, self.egress_policy)
            return [
                {
                    "hostname": host,
                    "host": address,
                    "port": port,
                    "family": socket.AF_INET6 if ":" in address else socket.AF_INET,
                    "proto": socket.IPPROTO_TCP,
                    "flags": socket.AI_NUMERICHOST,
                }
                for address in addresses
            ]

    return EgressConnector


def egress_connector(policy: EgressPolicy, **kwargs):
    """An aiohttp.TCPConnector whose every connection goes through the guard (kwargs: limits, ...).
    Use it with a session that has trust_env=False and requests with allow_redirects=False."""
    return _connector_class()(policy, **kwargs)
