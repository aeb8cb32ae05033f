"""A reconnection whose connection is closed right after its CONNACK is made again.

Found by the soak's ``forge`` fault (benchmarks/soak.py): a holder of node j's broker password
connects as node j (the broker binds sessions to user names), so the broker closes node j's
connection; node j reconnects, and the next forged connection closes that one just after its
CONNACK. With x's queued for the broker, paho read the CONNACK and the close in one go, before the
transport's connect resumed: it took itself as connected, the supervisor ignored the loss, and
node j never came back (its neighbours stopped after 60 s without its x). A broker on loopback
plays it: the first connection is closed, the reconnection gets its CONNACK and is closed at
once, the third stays; the message published in between must arrive.
"""

from __future__ import annotations

import asyncio

from nlagg_node.runtime.mqtt import MqttTransport
from tests.harness.mqtt_frames import (
    CONNECT,
    DISCONNECT,
    PINGREQ,
    PUBLISH,
    SUBSCRIBE,
    FrameSplitter,
    decode_publish,
    puback_frame,
)

CONNACK_PRESENT = b"\x20\x02\x01\x00"  # session present, accepted


async def test_a_connection_closed_right_after_its_connack_is_made_again() -> None:
    received: asyncio.Queue[bytes] = asyncio.Queue()
    connections: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        k = len(connections)
        connections.append(writer)
        frames = FrameSplitter()
        try:
            while data := await reader.read(1 << 16):
                for first, body in frames.feed(data):
                    kind = first >> 4
                    if kind == CONNECT:
                        writer.write(CONNACK_PRESENT)
                        if k == 1:  # taken over just after its CONNACK
                            return
                    elif kind == SUBSCRIBE:
                        writer.write(b"\x90\x03" + body[:2] + b"\x01")
                    elif kind == PUBLISH:
                        pub = decode_publish(first, body)
                        if pub.qos:
                            writer.write(puback_frame(pub.packet_id))
                        received.put_nowait(pub.payload)
                    elif kind == PINGREQ:
                        writer.write(b"\xd0\x00")
                    elif kind == DISCONNECT:
                        return
                await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        transport = MqttTransport(f"mqtt://127.0.0.1:{port}", client_id="node3", backoff_base=0.01)
        async with transport:
            await transport.subscribe("t/#")
            connections[0].close()  # the first takeover: the broker closes the node's connection
            for k in range(3):  # x's queued while it is down
                transport.publish_nowait("t/x", b"x%d" % k)
            async with asyncio.timeout(30):
                got = [await received.get() for _ in range(3)]
    assert got == [b"x0", b"x1", b"x2"]
    assert len(connections) >= 3
