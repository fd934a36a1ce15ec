"""The jail's loopback relayed to the worker's sockets: the only way out of the jail."""

from __future__ import annotations

import asyncio
import threading


def start_relay(socket_path: str) -> int:
    """Listen on 127.0.0.1 (inside the jail: its own loopback) and pipe each connection to the inference
    proxy's unix socket; returns the port. Any OpenAI client, the SDK's or one the script builds from
    OPENAI_BASE_URL, reaches the model this way. The proxy, outside the jail, decides what passes."""
    ready = threading.Event()
    found: dict[str, int] = {}

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def connection(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_unix_connection(socket_path)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pump(client_r, up_w), pump(up_r, client_w))

    async def serve() -> None:
        server = await asyncio.start_server(connection, "127.0.0.1", 0)
        found["port"] = server.sockets[0].getsockname()[1]
        ready.set()
        await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(serve()), name="artweb-relay", daemon=True).start()
    if not ready.wait(10):
        raise RuntimeError("the inference relay did not start")
    return found["port"]
