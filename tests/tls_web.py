"""A tool server for the named-host tests: HTTPS on 127.0.0.1 under a self-signed certificate for made-up
names (search.test, ...), which the tests map to 127.0.0.1 with `resolving` (no DNS server that answers
for them can run here). A jailed agent trusts the certificate by passing its PEM as the CA to verify
against, as it would a private CA of its own."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

NAMES = ("search.test", "other.test", "private.test", "unlisted.test", "rebind.test")


def self_signed(directory: Path) -> tuple[Path, Path]:
    """(certificate, key) for every name of NAMES."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    san = ",".join(f"DNS:{name}" for name in NAMES)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1"]
        + ["-subj", "/CN=search.test", "-addext", f"subjectAltName={san}"],
        check=True,
        capture_output=True,
    )
    return cert, key


class ToolServer:
    """HTTPS on 127.0.0.1: /search answers JSON (and echoes the bearer key it got, to show a secret arrived),
    /v1/chat/completions answers as an OpenAI server, /redirect answers 302 to `redirect_to`. Keeps each
    request's path and Authorization header."""

    def __init__(self, cert: Path, key: Path, redirect_to: str = "") -> None:
        self.requests: list[tuple[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                server.requests.append((self.path, self.headers.get("Authorization", "")))
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.startswith("/redirect"):
                    self.send_response(302)
                    self.send_header("Location", redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path.startswith("/v1/chat/completions"):
                    body = {
                        "id": "c1",
                        "object": "chat.completion",
                        "created": 0,
                        "model": "tool",
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hello"}}
                        ],
                    }
                else:
                    body = {"results": ["artweb"], "path": self.path}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _any

            def log_message(self, *args) -> None:
                pass

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def resolving(monkeypatch, names: dict[str, str]) -> None:
    """Answer lookups of `names` (name -> an address in 127.0.0.0/8) in this process, where the worker's
    proxy resolves what a jailed agent asks for; every other name resolves as usual."""
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host in names:
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (names[host], port))]
        return real(host, port, *args, **kwargs)

    assert all(address.startswith("127.") for address in names.values())
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
