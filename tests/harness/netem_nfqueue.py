"""A userspace stand-in for ``tc netem delay D J``: hold every queued packet D +- J ms, then accept it.

Used by test_multihost when the kernel has no ``sch_netem`` (minimal VM kernels): iptables sends
the node links' packets to NFQUEUE and this process gives each one its verdict after a random
delay (uniform in [D - J, D + J], so packets may be reordered as with netem's jitter). Loss is
done in the kernel by iptables' ``statistic`` match, not here. Only the Python standard library:
raw netfilter netlink messages (nfnetlink_queue, copy mode META, fail-open).

Run inside the network namespace whose iptables rules queue the packets::

    ip netns exec NS python tests/harness/netem_nfqueue.py --queue 0 --delay-ms 5 --jitter-ms 2
"""

from __future__ import annotations

import argparse
import heapq
import random
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_FAIL_OPEN = 1
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
_NLMSG = struct.Struct("=IHHII")


def _attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _message(msg: int, queue: int, attrs: bytes, seq: int, flags: int = NLM_F_REQUEST) -> bytes:
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return _NLMSG.pack(_NLMSG.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg, flags, seq, 0) + body


def _check_ack(sock: socket.socket, what: str) -> None:
    data = sock.recv(65536)
    _length, kind, _flags, _seq, _pid = _NLMSG.unpack_from(data, 0)
    if kind == NLMSG_ERROR:
        (err,) = struct.unpack_from("=i", data, _NLMSG.size)
        if err != 0:
            raise OSError(-err, f"nfqueue {what}: {struct.pack('=i', err)!r}")


def bind_queue(queue: int) -> socket.socket:
    """Open a netfilter netlink socket bound to NFQUEUE ``queue`` (metadata only, fail-open)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((0, 0))
    steps = [
        ("bind", _attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET))),
        ("params", _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))),
        ("maxlen", _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", 65536))),
        (
            "flags",
            _attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN))
            + _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN)),
        ),
    ]
    for seq, (what, attrs) in enumerate(steps, start=1):
        sock.send(_message(NFQNL_MSG_CONFIG, queue, attrs, seq, NLM_F_REQUEST | NLM_F_ACK))
        _check_ack(sock, what)
    sock.setblocking(False)
    return sock


def packet_ids(data: bytes) -> list[int]:
    """The packet ids of every NFQNL_MSG_PACKET in a netlink datagram."""
    ids = []
    off = 0
    while off + _NLMSG.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSG.unpack_from(data, off)
        if length < _NLMSG.size:
            break
        if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            pos = off + _NLMSG.size + 4  # skip nfgenmsg
            end = off + length
            while pos + 4 <= end:
                alen, atype = struct.unpack_from("=HH", data, pos)
                if alen < 4:
                    break
                if atype & 0x7FFF == NFQA_PACKET_HDR:
                    ids.append(struct.unpack_from("!I", data, pos + 4)[0])
                pos += (alen + 3) & ~3
        off += (length + 3) & ~3
    return ids


def run(queue: int, delay_ms: float, jitter_ms: float, seed: int | None) -> None:
    rng = random.Random(seed)
    sock = bind_queue(queue)
    pending: list[tuple[float, int]] = []
    seq = 100
    stop = False

    def _stop(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print("ready", flush=True)
    while not stop:
        now = time.monotonic()
        timeout = max(0.0, pending[0][0] - now) if pending else 0.2
        readable, _, _ = select.select([sock], [], [], timeout)
        if readable:
            while True:
                try:
                    data = sock.recv(1 << 16)
                except BlockingIOError:
                    break
                except OSError:  # ENOBUFS: the kernel accepted (fail-open) or dropped; carry on
                    break
                now = time.monotonic()
                for pid in packet_ids(data):
                    hold = max(0.0, delay_ms + rng.uniform(-jitter_ms, jitter_ms)) / 1000.0
                    heapq.heappush(pending, (now + hold, pid))
        now = time.monotonic()
        while pending and pending[0][0] <= now:
            _, pid = heapq.heappop(pending)
            seq += 1
            verdict = _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, pid))
            try:
                sock.send(_message(NFQNL_MSG_VERDICT, queue, verdict, seq))
            except BlockingIOError:
                select.select([], [sock], [], 0.01)
                sock.send(_message(NFQNL_MSG_VERDICT, queue, verdict, seq))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=5.0)
    parser.add_argument("--jitter-ms", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    run(args.queue, args.delay_ms, args.jitter_ms, args.seed)
    sys.exit(0)


if __name__ == "__main__":
    main()
