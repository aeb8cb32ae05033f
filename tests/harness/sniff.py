"""A passive loopback sniffer: a TCP relay that keeps a copy of every byte it forwards, both ways."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from nlagg_node.runtime.brokers import free_port

__all__ = ["Sniffer", "sniffing"]


class Sniffer:
    """What crossed the relay (``captured``) and the port clients dial (``port``)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.captured = bytearray()
        self.connections = 0


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sniffer: Sniffer) -> None:
    try:
        while data := await reader.read(65536):
            sniffer.captured += data
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def sniffing(target_host: str, target_port: int) -> AsyncIterator[Sniffer]:
    """Relay ``127.0.0.1:<sniffer.port>`` to the target while it runs, recording everything."""
    sniffer = Sniffer(free_port())
    tasks: set[asyncio.Task[None]] = set()

    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        sniffer.connections += 1
        try:
            server_r, server_w = await asyncio.open_connection(target_host, target_port)
        except OSError:
            client_w.close()
            return
        ups = [
            asyncio.create_task(_pipe(client_r, server_w, sniffer)),
            asyncio.create_task(_pipe(server_r, client_w, sniffer)),
        ]
        tasks.update(ups)
        await asyncio.gather(*ups, return_exceptions=True)
        tasks.difference_update(ups)

    server = await asyncio.start_server(relay, "127.0.0.1", sniffer.port)
    try:
        yield sniffer
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()
