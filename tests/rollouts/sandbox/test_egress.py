"""The egress guard (rollouts.sandbox.egress) and its local forward proxy (rollouts.sandbox.tunnel).

Every range the guard refuses is checked by refusal only: the guard decides before any connection is made,
and nothing here connects anywhere but 127.0.0.0/8. The clients are real (httpx, aiohttp, raw sockets), and
so are the servers, listening on 127.0.0.1.

Two tests replace a part of the system, because what they need cannot run here: the DNS rebinding tests
answer name lookups themselves (socket.getaddrinfo), since no DNS server that changes its answer can run
on these machines; and where the guard would then connect to the public address it checked, the
connection is recorded and refused instead (socket.create_connection, asyncio.open_connection), so that
no test ever leaves the machine.
"""

from __future__ import annotations

import asyncio
import base64
import socket
from urllib.parse import urlsplit

import aiohttp
import httpx
import pytest

from rollouts.sandbox.egress import (
    EgressPolicy,
    EgressRedirect,
    EgressRefused,
    address_refusal,
    egress_async_client,
    egress_client,
    egress_connect,
    egress_connector,
    egress_open_connection,
    egress_resolve,
)
from rollouts.sandbox.tunnel import LocalEgressProxy
from tests.egress import Listener, Web

STRICT = EgressPolicy()  # the default: public addresses on ports 443 and 80 only
PUBLIC = "93.184.215.14"  # a public address; only ever checked here, never connected to


@pytest.fixture
def listener():
    server = Listener(b"+PONG\r\n")
    yield server
    server.close()


def allowing(*targets: str, ports=()) -> EgressPolicy:
    return EgressPolicy.parse(targets, ports)


# --- what is refused ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "address, why",
    [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "IPv4-mapped IPv6"),
        ("::ffff:10.0.0.1", "IPv4-mapped IPv6"),
        ("::ffff:93.184.215.14", "IPv4-mapped IPv6"),  # even a public one: the mapped form is refused as such
        ("::7f00:1", "IPv4-compatible IPv6"),
        ("64:ff9b::7f00:1", "NAT64"),
        ("2002:7f00:1::1", "6to4"),
        ("2001:0:7f00:1::", "Teredo"),
        ("10.1.2.3", "private network"),
        ("172.16.0.1", "private network"),
        ("172.31.255.254", "private network"),
        ("192.168.1.1", "private network"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("100.127.255.254", "carrier-grade NAT"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local IPv6"),
        ("fc00::1", "unique-local IPv6"),
        ("fd00:ec2::254", "unique-local IPv6"),
        ("fec0::1", "site-local IPv6"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("0.1.2.3", '"this network"'),
        ("224.0.0.251", "multicast"),
        ("239.255.255.250", "multicast"),
        ("ff02::1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("192.0.0.170", "IETF protocol assignment"),
        ("192.0.2.10", "documentation"),
        ("198.51.100.7", "documentation"),
        ("203.0.113.9", "documentation"),
        ("2001:db8::1", "documentation"),
        ("198.18.0.1", "benchmarking"),
    ],
)
def test_it_refuses_every_address_that_is_not_public(address, why):
    with pytest.raises(EgressRefused) as exc:
        egress_resolve(address, 443, STRICT)
    message = str(exc.value)
    assert why in message and "only to public addresses" in message
    assert "ARTWEB_EGRESS_ALLOW=" in message  # the setting that would allow it, with the entry to write


@pytest.mark.parametrize("spelling", ["2130706433", "127.1", "0x7f.0.0.1", "017700000001"])
def test_the_other_spellings_of_loopback_are_refused_too(spelling):
    """The C library reads these as 127.0.0.1; the guard checks what they resolve to, not how they look."""
    with pytest.raises(EgressRefused, match=f"{spelling} resolves to 127.0.0.1, which is a loopback address"):
        egress_resolve(spelling, 80, STRICT)


@pytest.mark.parametrize("address", [PUBLIC, "8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_pass(address):
    import ipaddress

    assert address_refusal(ipaddress.ip_address(address)) is None
    assert egress_resolve(address, 443, STRICT) == [address]  # checked only: no connection is made


def test_a_name_that_resolves_to_loopback_is_refused_before_any_connection(listener):
    with pytest.raises(EgressRefused, match="localhost resolves to 127.0.0.1, which is a loopback address"):
        egress_connect("localhost", listener.port, allowing(ports=[listener.port]))
    with egress_client(allowing(ports=[listener.port])) as client, pytest.raises(EgressRefused):
        client.get(f"http://localhost:{listener.port}/")
    assert listener.connections == 0


def test_ports_other_than_443_and_80_need_the_operator():
    with pytest.raises(EgressRefused) as exc:
        egress_resolve(PUBLIC, 6379, STRICT)
    assert "Port 6379" in str(exc.value) and "ARTWEB_EGRESS_PORTS" in str(exc.value)
    assert egress_resolve(PUBLIC, 6379, allowing(ports=[6379])) == [PUBLIC]
    assert egress_resolve(PUBLIC, 80, STRICT) == egress_resolve(PUBLIC, 443, STRICT) == [PUBLIC]


def test_the_operator_allows_one_host_and_port_exactly(listener):
    other = Listener(b"other")
    try:
        policy = allowing(f"127.0.0.1:{listener.port}")
        with egress_connect("127.0.0.1", listener.port, policy) as sock:
            sock.sendall(b"PING\r\n")
            assert sock.recv(16) == b"+PONG\r\n"
        with pytest.raises(EgressRefused, match="loopback"):  # the same host on another port
            egress_connect("127.0.0.1", other.port, allowing(f"127.0.0.1:{listener.port}", ports=[other.port]))
        with pytest.raises(EgressRefused, match="localhost resolves to 127.0.0.1"):  # another name for it
            egress_connect("localhost", listener.port, policy)
        assert other.connections == 0 and listener.connections == 1
    finally:
        other.close()


def test_the_settings_are_read_strictly():
    with pytest.raises(ValueError, match="ARTWEB_EGRESS_ALLOW: 'wandb.internal' is not host:port"):
        EgressPolicy.parse(["wandb.internal"])
    with pytest.raises(ValueError, match="ARTWEB_EGRESS_PORTS: 'https' is not a port number"):
        EgressPolicy.parse([], ["https"])
    policy = EgressPolicy.parse([" Wandb.Internal.:8080", "[::1]:9000", ""], ["8443"])
    assert policy.allowed_hosts == {"wandb.internal:8080", "[::1]:9000"} and policy.allowed_ports == {8443}
    assert policy.allows("WANDB.internal", 8080) and policy.allows("::1", 9000) and not policy.allows("::1", 9001)


# --- DNS rebinding --------------------------------------------------------------------------------------


@pytest.fixture
def rebinding(monkeypatch, listener):
    """rebind.test answers a public address to its first lookup and 127.0.0.1 to every later one; connections
    to anything but 127.0.0.0/8 are recorded and refused (see the module's docstring)."""
    answers = {"lookups": 0, "connects": []}
    real_getaddrinfo, real_create = socket.getaddrinfo, socket.create_connection

    def getaddrinfo(host, port, *args, **kwargs):
        if host != "rebind.test":
            return real_getaddrinfo(host, port, *args, **kwargs)
        answers["lookups"] += 1
        address = PUBLIC if answers["lookups"] == 1 else "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))]

    def create_connection(address, *args, **kwargs):
        answers["connects"].append(tuple(address[:2]))
        if not str(address[0]).startswith("127."):
            raise ConnectionRefusedError(111, "Connection refused (the test never leaves the machine)")
        return real_create(address, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    return answers


def test_a_name_that_rebinds_cannot_make_the_guard_connect_to_loopback(rebinding, listener):
    policy = allowing(ports=[listener.port])
    url = f"http://rebind.test:{listener.port}/"
    with egress_client(policy, timeout=5) as client:
        with pytest.raises(httpx.ConnectError):
            client.get(url)
        # One lookup, and the connection went to the address it checked: the second answer, 127.0.0.1, was
        # never asked for between the check and the connect.
        assert rebinding["lookups"] == 1 and rebinding["connects"] == [(PUBLIC, listener.port)]
        # A new connection is checked again, and now the name is refused.
        with pytest.raises(EgressRefused, match="rebind.test resolves to 127.0.0.1"):
            client.get(url)
    assert rebinding["lookups"] == 2 and rebinding["connects"] == [(PUBLIC, listener.port)]
    with pytest.raises(EgressRefused):
        egress_connect("rebind.test", listener.port, policy)
    assert listener.connections == 0


def test_the_asyncio_connection_goes_to_the_checked_address_too(rebinding, listener, monkeypatch):
    real_open = asyncio.open_connection

    async def open_connection(host, port, **kwargs):
        rebinding["connects"].append((host, port))
        if not host.startswith("127."):
            raise ConnectionRefusedError(111, "Connection refused (the test never leaves the machine)")
        return await real_open(host, port, **kwargs)

    monkeypatch.setattr(asyncio, "open_connection", open_connection)
    policy = allowing(ports=[listener.port])

    async def twice():
        with pytest.raises(ConnectionRefusedError):
            await egress_open_connection("rebind.test", listener.port, policy, timeout=5)
        with pytest.raises(EgressRefused, match="rebind.test resolves to 127.0.0.1"):
            await egress_open_connection("rebind.test", listener.port, policy, timeout=5)

    asyncio.run(twice())
    assert rebinding["lookups"] == 2 and rebinding["connects"] == [(PUBLIC, listener.port)]
    assert listener.connections == 0


# --- redirects and the clients --------------------------------------------------------------------------


def test_a_redirect_is_an_error_naming_it_and_is_not_followed():
    second = Web(200, b'{"secret": "second server"}')
    first = Web(302, b"", {"Location": f"{second.url}/internal"})
    try:
        policy = allowing(f"127.0.0.1:{first.port}", f"127.0.0.1:{second.port}")  # even where both are allowed
        with egress_client(policy, timeout=5) as client:
            with pytest.raises(EgressRedirect) as exc:
                client.post(f"{first.url}/v1", json={"a": 1})
        message = str(exc.value)
        assert "answered HTTP 302 Found, a redirect to 127.0.0.1" in message and "not followed" in message
        assert "secret" not in message
        assert first.paths == ["/v1"] and second.paths == []
    finally:
        first.close()
        second.close()


def test_the_async_client_refuses_and_pins_alike(listener):
    web = Web(200, b'{"ok": true}')

    async def calls():
        async with egress_async_client(STRICT, timeout=5) as client:
            with pytest.raises(EgressRefused, match="loopback"):
                await client.get(f"http://127.0.0.1:{listener.port}/")
        async with egress_async_client(allowing(f"127.0.0.1:{web.port}"), timeout=5) as client:
            return (await client.get(f"{web.url}/ok")).json()

    try:
        assert asyncio.run(calls()) == {"ok": True}
        assert listener.connections == 0 and web.paths == ["/ok"]
    finally:
        web.close()


def test_a_pinned_connection_still_speaks_tls_to_the_name(tmp_path, monkeypatch):
    """The socket goes to the checked address, and TLS still goes to the name: SNI and the certificate
    check use the URL's host. No public authority signs for localhost, so the client trusts this test's
    own self-signed certificate (the guard's TLS context is replaced for that, and only that)."""
    import ssl
    import subprocess

    from rollouts.sandbox import egress

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1"]
        + ["-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
        check=True,
        capture_output=True,
    )
    names: list[str | None] = []
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    server_side.sni_callback = lambda sock, name, ctx: names.append(name)
    web = Web(200, b'{"ok": true}')
    web._server.socket = server_side.wrap_socket(web._server.socket, server_side=True)
    monkeypatch.setattr(egress, "_tls_context", lambda: ssl.create_default_context(cafile=str(cert)))
    try:
        with egress_client(allowing(f"localhost:{web.port}"), timeout=5) as client:
            assert client.get(f"https://localhost:{web.port}/by-name").json() == {"ok": True}
        with egress_client(allowing(f"127.0.0.1:{web.port}"), timeout=5) as client:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                client.get(f"https://127.0.0.1:{web.port}/by-address")  # the certificate names localhost
    finally:
        web.close()
    assert names[0] == "localhost" and web.paths == ["/by-name"]


def test_an_egress_client_cannot_be_given_a_way_around_the_guard():
    for name in ("transport", "mounts", "proxy", "follow_redirects", "trust_env"):
        with pytest.raises(TypeError, match="route around the guard"):
            egress_client(STRICT, **{name: None})


def test_the_aiohttp_connector_checks_ip_literals_and_names(listener):
    web = Web(200, b'{"ok": true}')

    async def calls():
        async with aiohttp.ClientSession(connector=egress_connector(STRICT), trust_env=False) as session:
            for host in ("127.0.0.1", "localhost", "[::ffff:127.0.0.1]"):
                with pytest.raises(EgressRefused):
                    await session.get(f"http://{host}:{listener.port}/")
        policy = allowing(f"127.0.0.1:{web.port}")
        async with aiohttp.ClientSession(connector=egress_connector(policy), trust_env=False) as session:
            async with session.get(f"{web.url}/ok") as reply:
                return await reply.json()

    try:
        assert asyncio.run(calls()) == {"ok": True}
        assert listener.connections == 0
    finally:
        web.close()


# --- the local forward proxy for clients that open their own connections --------------------------------


def _proxy_request(proxy: LocalEgressProxy, head: str, *, credential: bool = True) -> bytes:
    auth = base64.b64encode(f"artweb:{urlsplit(proxy.url).password}".encode()).decode()
    target = head.split(" ")[1]
    lines = head + f"Host: {target}\r\n" + (f"Proxy-Authorization: Basic {auth}\r\n" if credential else "") + "\r\n"
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(lines.encode())
        out = b""
        while chunk := sock.recv(1 << 16):
            out += chunk
            if b"200 Connection Established" in out:
                sock.sendall(b"PING\r\n")
                out += sock.recv(64)
                break
    return out


def test_the_local_proxy_needs_its_credential(listener):
    with LocalEgressProxy(allowing(f"127.0.0.1:{listener.port}")) as proxy:
        answer = _proxy_request(proxy, f"CONNECT 127.0.0.1:{listener.port} HTTP/1.1\r\n", credential=False)
    assert answer.startswith(b"HTTP/1.1 407") and listener.connections == 0


def test_the_local_proxy_tunnels_only_where_the_guard_allows(listener):
    with LocalEgressProxy(allowing(f"127.0.0.1:{listener.port}")) as proxy:
        allowed = _proxy_request(proxy, f"CONNECT 127.0.0.1:{listener.port} HTTP/1.1\r\n")
        redis = _proxy_request(proxy, "CONNECT 127.0.0.1:6379 HTTP/1.1\r\n")
        metadata = _proxy_request(proxy, "CONNECT 169.254.169.254:80 HTTP/1.1\r\n")
    assert allowed.startswith(b"HTTP/1.1 200") and allowed.endswith(b"+PONG\r\n")
    assert redis.startswith(b"HTTP/1.1 403") and b"ARTWEB_EGRESS_ALLOW=127.0.0.1:6379" in redis
    assert metadata.startswith(b"HTTP/1.1 403") and b"link-local" in metadata
    assert listener.connections == 1
    assert any("127.0.0.1:6379" in p for p in proxy.problems)


def test_the_local_proxy_passes_plain_http_without_bodies_that_are_not_json():
    page = Web(500, b"<h1>SECRET admin console</h1>", {"Content-Type": "text/html"})
    api = Web(200, b'{"data": {"viewer": null}}')
    second = Web(200, b'{"secret": 1}')
    moved = Web(307, b"", {"Location": f"{second.url}/x"})
    policy = allowing(*(f"127.0.0.1:{w.port}" for w in (page, api, second, moved)))
    try:
        with LocalEgressProxy(policy) as proxy, httpx.Client(proxy=proxy.url, timeout=10) as client:
            error = client.get(f"{page.url}/admin")
            answer = client.post(f"{api.url}/graphql", json={"query": "{ viewer { id } }"})
            redirect = client.post(f"{moved.url}/graphql", json={})
            refused = client.get("http://127.0.0.1:6379/")
    finally:
        for web in (page, api, second, moved):
            web.close()
    assert error.status_code == 500 and error.content == b""  # its status line only
    assert answer.status_code == 200 and answer.json() == {"data": {"viewer": None}}
    assert redirect.status_code == 502 and "a redirect to 127.0.0.1" in redirect.text and second.paths == []
    assert refused.status_code == 403 and "ARTWEB_EGRESS_ALLOW=127.0.0.1:6379" in refused.text
    assert [p.split(" ", 1)[0] for p in proxy.problems] == ["127.0.0.1", "127.0.0.1"]  # the redirect, Redis
