"""The egress guard in tests: the local servers that stand in for external ones (export services, judge
endpoints) listen on 127.0.0.1, which the guard refuses unless the operator allows that host and port with
ARTWEB_EGRESS_ALLOW. egress_allow does that for one test, as an operator would for a server on a private
network. Listener and Web are such servers: a bare TCP one (a Redis or a banner) and an HTTP one."""

import dataclasses
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def egress_allow(settings, url: str) -> str:
    """Let the egress guard reach url's host and port for this test (settings: pytest-django's); returns url."""
    from rollouts.sandbox.egress import target_key, url_target

    host, port = url_target(url)
    policy = settings.ARTWEB_EGRESS
    settings.ARTWEB_EGRESS = dataclasses.replace(policy, allowed_hosts=policy.allowed_hosts | {target_key(host, port)})
    return url


class Listener:
    """A TCP server on 127.0.0.1 that counts connections, keeps what they send and answers `answer`."""

    def __init__(self, answer: bytes = b"") -> None:
        self.answer = answer
        self.connections = 0
        self.received = bytearray()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(2)
            try:
                self.received += conn.recv(1 << 16)
                conn.sendall(self.answer)
            except OSError:
                pass

    def close(self) -> None:
        self._server.close()


class Web:
    """An HTTP server on 127.0.0.1 answering every request with (status, headers, body); keeps the paths."""

    def __init__(self, status: int = 200, body: bytes = b"{}", headers: dict | None = None) -> None:
        self.paths: list[str] = []
        web = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                web.paths.append(self.path)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _any

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
