"""A connection attempt that gets no CONNACK costs one timeout, and nothing of it reaches the next.

Found while chasing a capture that came back from a broker crash too late for the nodes' last
republish. A failed attempt's socket was closed by paho in the connect thread of the next attempt;
the event loop then unregistered a closed socket (``Invalid file descriptor: -1``) and kept a stale
entry for its descriptor, so a later socket given the same number was never read: its CONNACK was
lost and that attempt timed out too (over the capture's 30 s). The old attempt's DISCONNECT, written
while the next attempt waited, also failed that attempt ("connection closed before the CONNACK").
A broker on loopback plays it: the first ``silent`` connections are accepted and never answered,
the next one is served; the client must connect at attempt ``silent + 1`` and then work.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from nlagg_node.runtime.mqtt import MqttTransport
from tests.harness.mqtt_frames import (
    CONNECT,
    DISCONNECT,
    PUBLISH,
    FrameSplitter,
    decode_publish,
    puback_frame,
)

CONNACK_NEW = b"\x20\x02\x00\x00"  # no session present, accepted


@pytest.mark.parametrize("silent", [1, 3], ids=["one-silent-attempt", "three-silent-attempts"])
async def test_each_silent_attempt_costs_one_timeout_and_the_next_one_works(
    silent: int, caplog: pytest.LogCaptureFixture
) -> None:
    received: asyncio.Queue[bytes] = asyncio.Queue()
    held: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        if len(held) <= silent:
            return  # accepted, never answered: the client's attempt times out
        frames = FrameSplitter()
        while data := await reader.read(1 << 16):
            for first, body in frames.feed(data):
                kind = first >> 4
                if kind == CONNECT:
                    writer.write(CONNACK_NEW)
                elif kind == PUBLISH:
                    pub = decode_publish(first, body)
                    writer.write(puback_frame(pub.packet_id))
                    received.put_nowait(pub.payload)
                elif kind == DISCONNECT:
                    return
            await writer.drain()

    caplog.set_level(logging.ERROR, logger="asyncio")
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        transport = MqttTransport(
            f"mqtt://127.0.0.1:{port}", client_id="node3", connect_timeout=0.5, backoff_base=0.0
        )
        async with transport:
            attempts = transport.attempts
            async with asyncio.timeout(30):
                await transport.publish("t/x", b"after")  # returns on the PUBACK: the socket is read
                got = await received.get()
        for writer in held:
            writer.close()
    assert (attempts, len(held), got) == (silent + 1, silent + 1, b"after")
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
