"""Named hosts and secrets against the real jail, proxy and tunnel: a jailed agent reaches the tool server
its run lists and the operator allowed, with the standard clients and nothing special in the script, and
is refused everywhere else, each refusal in the rollout's logs.

The tool server is real (HTTPS on 127.0.0.1, tests.tls_web). Its names (search.test, ...) are answered in
this process (tests.tls_web.resolving), where the worker's proxy resolves what the agent asks for,
because no DNS server that answers for them can run here. The rebinding test also records the connection
the guard makes to the public address it checked, and refuses it, so that no test leaves the machine.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from rollouts.sandbox.egress import EgressPolicy
from rollouts.sandbox.rollouts import run_rollouts
from rollouts.sandbox.tools import SCRUBBED
from tests.egress import Listener
from tests.tls_web import ToolServer, resolving, self_signed

PUBLIC = "93.184.215.14"  # a public address; only ever checked here, never connected to

AGENT = """
import art, os, ssl, urllib.request

import httpx, openai, requests


async def rollout(model, scenario):
    ca = "/tmp/tool-ca.pem"
    with open(ca, "w") as fh:
        fh.write(scenario.ca)
    out = {}

    def attempt(name, call):
        try:
            out[name] = call()
        except Exception as exc:
            out[name] = "refused: " + type(exc).__name__

    base = scenario.base
    key = os.environ.get("SEARCH_API_KEY", "")
    headers = {"Authorization": "Bearer " + key}
{calls}
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=1.0, metadata=out)
"""


def agent(calls: str) -> str:
    return AGENT.replace("{calls}", "\n".join("    " + line for line in calls.strip().splitlines()))


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def tools(cert):
    """The allowed tool server, and a second one the first redirects to (allowed by the operator as well, and
    named by no run): whatever stops the redirect is the run's list of hosts, not the operator's."""
    second = ToolServer(*cert)
    first = ToolServer(*cert, redirect_to=f"https://other.test:{second.port}/stolen")
    yield first, second
    first.close()
    second.close()


def batch(request_for, cert, script: str, hosts, policy: EgressPolicy, **kwargs):
    scenario = {"ca": cert[0].read_text(), "base": kwargs.pop("base", "")}
    return run_rollouts(
        request_for(
            script,
            scenarios=[scenario],
            group_size=1,
            egress_hosts=tuple(hosts),
            egress_policy=policy,
            **kwargs,
        )
    )[0].trajectories[0]


def test_an_agent_reaches_its_allowed_host_with_the_standard_clients(request_for, cert, tools, monkeypatch):
    """requests, httpx, urllib and the openai client with a custom base_url reach the listed host through
    HTTPS_PROXY as the guest sets it; every connection is in the rollout's logs with its bytes and time."""
    first, _ = tools
    resolving(monkeypatch, {"search.test": "127.0.0.1"})
    base = f"https://search.test:{first.port}"
    calls = """
attempt("requests", lambda: requests.get(base + "/search?q=a", verify=ca, timeout=10).json()["results"])
attempt("httpx", lambda: httpx.get(base + "/search?q=b", verify=ca, timeout=10).json()["results"])
context = ssl.create_default_context(cafile=ca)
attempt("urllib", lambda: len(urllib.request.urlopen(base + "/search?q=c", context=context, timeout=10).read()) > 0)
client = openai.OpenAI(base_url=base + "/v1", api_key="k", http_client=httpx.Client(verify=ca))
attempt("openai", lambda: client.chat.completions.create(model="tool", messages=[]).choices[0].message.content)
"""
    policy = EgressPolicy.parse([f"search.test:{first.port}"])
    t = batch(request_for, cert, agent(calls), [f"search.test:{first.port}"], policy, base=base)
    assert t["error"] is None, t["error"]
    assert t["metadata"] == {"requests": ["artweb"], "httpx": ["artweb"], "urllib": True, "openai": "hello"}
    assert [p for p, _ in first.requests] == ["/search?q=a", "/search?q=b", "/search?q=c", "/v1/chat/completions"]
    lines = [line for line in t["logs"] if line.startswith("[artweb tunnel]")]
    assert "4 HTTPS connection(s) of this batch" in lines[0]
    assert all(f"search.test:{first.port}: connected" in line and "received" in line for line in lines[1:])
    assert len(lines) == 5


def test_a_host_the_run_does_not_list_is_refused(request_for, cert, tools, monkeypatch):
    """Guard: the run's list of hosts (the tunnel's allow-list). unlisted.test is one the operator allows,
    so only the list stands between the agent and it."""
    first, _ = tools
    resolving(monkeypatch, {"search.test": "127.0.0.1", "unlisted.test": "127.0.0.1"})
    policy = EgressPolicy.parse([f"search.test:{first.port}", f"unlisted.test:{first.port}"])
    calls = 'attempt("unlisted", lambda: requests.get(base + "/search", verify=ca, timeout=10).status_code)'
    base = f"https://unlisted.test:{first.port}"
    t = batch(request_for, cert, agent(calls), [f"search.test:{first.port}"], policy, base=base)
    assert t["metadata"] == {"unlisted": "refused: ProxyError"}
    assert first.requests == []
    assert any(
        f"unlisted.test:{first.port}: refused" in line and "is not one of this run's hosts" in line
        for line in t["logs"]
    )


def test_a_listed_name_at_a_private_address_is_refused(request_for, cert, monkeypatch):
    """Guard: public addresses only (egress_resolve). private.test is on the run's list but resolves to
    127.0.0.1, which the operator did not allow; a listener there shows the refusal is the guard's, not a
    closed port's."""
    listener = Listener(b"+PONG\r\n")
    resolving(monkeypatch, {"private.test": "127.0.0.1"})
    with socket.create_connection(("127.0.0.1", listener.port), timeout=5):
        pass  # reachable from outside the jail
    base = f"https://private.test:{listener.port}"
    calls = 'attempt("private", lambda: requests.get(base + "/", verify=ca, timeout=10).status_code)'
    policy = EgressPolicy.parse([], [listener.port])  # the port is allowed; the address is not
    try:
        t = batch(request_for, cert, agent(calls), [f"private.test:{listener.port}"], policy, base=base)
    finally:
        listener.close()
    assert t["metadata"] == {"private": "refused: ProxyError"}
    assert listener.connections == 1  # the one from outside
    refusal = next(line for line in t["logs"] if f"private.test:{listener.port}: refused" in line)
    assert "resolves to 127.0.0.1, which is a loopback address" in refusal
    assert f"ARTWEB_EGRESS_ALLOW=private.test:{listener.port}" in refusal


def test_a_redirect_to_another_host_is_not_followed_through_the_tunnel(request_for, cert, tools, monkeypatch):
    """Guard: each tunnel goes to one listed host. The allowed server redirects to other.test, which the
    operator allows but the run does not list: the client's new CONNECT is refused, and the second server
    never sees a request."""
    first, second = tools
    resolving(monkeypatch, {"search.test": "127.0.0.1", "other.test": "127.0.0.1"})
    policy = EgressPolicy.parse([f"search.test:{first.port}", f"other.test:{second.port}"])
    base = f"https://search.test:{first.port}"
    calls = 'attempt("redirect", lambda: requests.get(base + "/redirect", verify=ca, timeout=10).status_code)'
    t = batch(request_for, cert, agent(calls), [f"search.test:{first.port}"], policy, base=base)
    assert t["metadata"] == {"redirect": "refused: ProxyError"}
    assert [p for p, _ in first.requests] == ["/redirect"] and second.requests == []
    assert any(f"search.test:{first.port}: connected" in line for line in t["logs"])
    assert any(f"other.test:{second.port}: refused" in line for line in t["logs"])


def test_a_name_that_rebinds_cannot_reach_loopback_through_the_tunnel(request_for, cert, monkeypatch):
    """Guard: one lookup per connection, and the connection goes to the address checked
    (egress_open_connection). rebind.test answers a public address first and 127.0.0.1 afterwards; a guard
    that looked the name up again to connect would reach the listener on 127.0.0.1."""
    listener = Listener(b"+PONG\r\n")
    lookups, connects = [], []
    real_getaddrinfo, real_open = socket.getaddrinfo, asyncio.open_connection

    def getaddrinfo(host, port, *args, **kwargs):
        if host != "rebind.test":
            return real_getaddrinfo(host, port, *args, **kwargs)
        lookups.append(host)
        address = PUBLIC if len(lookups) == 1 else "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))]

    async def open_connection(host, port, **kwargs):
        connects.append((host, port))
        if not str(host).startswith("127."):
            raise ConnectionRefusedError(111, "Connection refused (the test never leaves the machine)")
        return await real_open(host, port, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(asyncio, "open_connection", open_connection)
    base = f"https://rebind.test:{listener.port}"
    calls = """
attempt("first", lambda: requests.get(base + "/", verify=ca, timeout=10).status_code)
attempt("second", lambda: requests.get(base + "/", verify=ca, timeout=10).status_code)
"""
    policy = EgressPolicy.parse([], [listener.port])
    try:
        t = batch(request_for, cert, agent(calls), [f"rebind.test:{listener.port}"], policy, base=base)
    finally:
        listener.close()
    assert t["metadata"] == {"first": "refused: ProxyError", "second": "refused: ProxyError"}
    assert len(lookups) == 2 and connects == [(PUBLIC, listener.port)]
    assert listener.connections == 0
    refusals = [line for line in t["logs"] if f"rebind.test:{listener.port}: refused" in line]
    assert "cannot be reached" in refusals[0] and "resolves to 127.0.0.1, which is a loopback" in refusals[1]


def test_secrets_reach_only_their_own_batch_and_never_its_results(request_for, cert, tools, monkeypatch):
    """A run's secret is an environment variable of its own batch: the tool server gets it, the script
    that prints os.environ shows it nowhere in the stored result (scrubbed), and another batch, run after
    it on the same worker (another run's, another user's), never sees it."""
    first, _ = tools
    resolving(monkeypatch, {"search.test": "127.0.0.1"})
    base = f"https://search.test:{first.port}"
    policy = EgressPolicy.parse([f"search.test:{first.port}"])
    calls = """
print(dict(os.environ))
out["seen"] = sorted(k for k in os.environ if k.endswith("_API_KEY") and k != "OPENAI_API_KEY")
attempt("search", lambda: requests.get(base + "/search", headers=headers, verify=ca, timeout=10).json()["results"])
"""
    alice_key, bob_key = "sk-alice-0123456789abcdef", "sk-bob-fedcba9876543210"
    hosts = [f"search.test:{first.port}"]
    mine = batch(request_for, cert, agent(calls), hosts, policy, base=base, secrets={"SEARCH_API_KEY": alice_key})
    other = batch(request_for, cert, agent(calls), hosts, policy, base=base, secrets={"OTHER_API_KEY": bob_key})
    assert mine["metadata"] == {"seen": ["SEARCH_API_KEY"], "search": ["artweb"]}
    assert other["metadata"] == {"seen": ["OTHER_API_KEY"], "search": ["artweb"]}
    assert [auth for _, auth in first.requests] == [f"Bearer {alice_key}", "Bearer "]
    printed = "\n".join(mine["logs"])
    assert "SEARCH_API_KEY" in printed and SCRUBBED in printed and alice_key not in str(mine)
    assert alice_key not in str(other) and bob_key not in str(other) and bob_key not in str(mine)


def test_a_secret_never_takes_a_name_the_sandbox_sets(request_for):
    """The worker passes no secret under one of the sandbox's own names, even one that got past the store."""
    code = agent('out["base"] = os.environ["OPENAI_BASE_URL"].startswith("http://127.0.0.1:")')
    t = run_rollouts(
        request_for(
            code,
            scenarios=[{"ca": "", "base": ""}],
            group_size=1,
            secrets={"OPENAI_BASE_URL": "https://evil.example/v1", "ARTWEB_PROXY_SOCKET": "/tmp/x"},
        )
    )[0].trajectories[0]
    assert t["error"] is None and t["metadata"] == {"base": True}
