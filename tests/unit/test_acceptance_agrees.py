"""The nodes and the transcript decide every message alike: they call one acceptance rule.

Two receivers (nodes 0 and 2 of a 6-ring, the neighbours of node 1) and a transcript see the same
run up to iteration ``P`` (each receiver waits for x^(P), the capture has seen x^(P) of both),
then the same hostile messages. Each message gets one decision per side: ``taken``, ``dup`` or
``refused``; the sides must agree on every one, and on the expected decision.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from adversary.transcript import Transcript
from nlagg_node.config import RunConfig
from nlagg_node.errors import EquivocationError
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import Node, build_config_msg, run_edges
from nlagg_node.runtime.transport import Message
from nlagg_node.runtime.wire import StatusMsg, Z0Msg, encode, encode_x, topics

RUN = "acc"
TP = topics("nlagg", RUN)
P = 5  # the receivers' position when the hostile messages come
SENDER, RECEIVERS = 1, (0, 2)


def honest(i: int, t: int) -> float:
    return 10.0 - t - 0.125 * i


@dataclass
class Sides:
    """The receivers of node 1's messages and the transcript, all at position :data:`P`."""

    nodes: dict[int, Node]
    transcript: Transcript
    early: bool
    group: str
    kept: set[tuple[str, bytes]] = field(default_factory=set)  # what the transcript stored as valid

    def x(self, i: int, t: int, x: float, phase: str = "max", stop: int | None = None) -> tuple[str, bytes]:
        return TP.x(i), encode_x(node=i, t=t, phase=phase, x=x, quiet=0 if self.early else None, stop=stop)

    def node_decides(self, node: Node, topic: str, payload: bytes) -> str:
        rejected, duplicates = node.rejected, node.duplicates
        try:
            node.feed(Message(topic, payload))
        except EquivocationError as exc:
            return "equivocation" if exc.node == SENDER else f"equivocation of node {exc.node}"
        return "dup" if node.duplicates > duplicates else "refused" if node.rejected > rejected else "taken"

    def transcript_decides(self, topic: str, payload: bytes) -> str:
        if self.transcript.add(topic, payload) is None:
            why = self.transcript.rejected()[-1][1]
            return "equivocation" if f"on node {SENDER}'s topic (equivocation" in why else "refused"
        before = (topic, payload) in self.kept
        self.kept.add((topic, payload))
        return "dup" if before else "taken"

    def decide(self, topic: str, payload: bytes, at: tuple[int, ...] = RECEIVERS) -> set[str]:
        """Every side's decision on one message (a set of one when they agree)."""
        made = {self.node_decides(self.nodes[i], topic, payload) for i in at}
        return made | {self.transcript_decides(topic, payload)}


async def _reach(sides: Sides, cfg: RunConfig) -> None:
    """Every node's x of iterations 0..P-1 (taken by the receivers), and the receivers' x^(P)."""
    edges = run_edges(cfg)
    nbrs = {
        i: {int(b) for a, b in edges.tolist() if a == i} | {int(a) for a, b in edges.tolist() if b == i}
        for i in RECEIVERS
    }
    for t in range(P):
        for k in range(cfg.n):
            topic, payload = sides.x(k, t, honest(k, t))
            assert sides.transcript.add(topic, payload) is not None
            for i, node in sides.nodes.items():
                if k in nbrs[i]:
                    node.feed(Message(topic, payload))
        for node in sides.nodes.values():
            await node.member.x_in.take(t)
    for i in RECEIVERS:
        assert sides.transcript.add(*sides.x(i, P, honest(i, P))) is not None


@pytest.fixture(params=[False, True], ids=["fixed", "early-stop"])
async def sides(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Sides]:
    early = bool(request.param)
    cfg = RunConfig(op="max", n=6, graph="ring", t_max=20, trials=1, early_stop=early, init_channel="plain")
    edges = run_edges(cfg)
    broker = MemoryBroker()
    async with AsyncExitStack() as stack:
        nodes = {
            i: await stack.enter_async_context(
                Node(cfg, i, 1.0, MemoryTransport(broker, f"n{i}"), run_id=RUN, edges=edges)
            )
            for i in RECEIVERS
        }
        tr = stack.enter_context(Transcript(tmp_path / "t.sqlite", run_id=RUN))
        tr.add(TP.config, encode(build_config_msg(cfg, RUN, edges)), retained=True)
        s = Sides(nodes, tr, early, nodes[0].member.shape.exchanges[0])
        await _reach(s, cfg)
        yield s


Step = tuple[tuple[str, bytes], str] | tuple[tuple[str, bytes], str, tuple[int, ...]]


def forged_in_window(s: Sides) -> list[Step]:
    return [
        (s.x(1, P + 1, 42.0), "taken"),  # in every receiver's window: the first one wins everywhere
        (s.x(1, P, honest(1, P)), "taken"),
        (s.x(1, P + 1, honest(1, P + 1)), "equivocation"),  # the real one now conflicts: the run stops
    ]


def duplicates_and_conflicts(s: Sides) -> list[Step]:
    return [
        (s.x(1, P, honest(1, P)), "taken"),
        (s.x(1, P, honest(1, P)), "dup"),
        (s.x(1, P, 7.0), "equivocation"),
    ]


def out_of_the_run(s: Sides) -> list[Step]:
    return [
        (s.x(1, P + 2, 1.0), "refused"),  # ahead of every window
        (s.x(1, 20, 1.0), "refused"),  # t_total = 20
        (s.x(1, P, 1.0, phase="min"), "refused"),
        (s.x(9, P, 1.0), "refused", ()),  # no node 9 (the receivers do not listen to it)
    ]


def impossible_stop(s: Sides) -> list[Step]:
    """A stop at P lies before the run's earliest stop (2D + W - 1): the x is taken, its stop ends
    nothing, so its sender's next x is taken too (the receivers' state machines refuse the claim)."""
    if not s.early:  # a stop in a fixed-schedule run is refused for its fields
        return [(s.x(1, P, honest(1, P), stop=P), "refused")]
    return [(s.x(1, P, honest(1, P), stop=P), "taken"), (s.x(1, P + 1, honest(1, P + 1)), "taken")]


def status(node: int, **fields: object) -> tuple[str, bytes]:
    return TP.status(node), encode(StatusMsg.model_validate({"node": node, **fields}))


def departure_claims(s: Sides) -> list[Step]:
    return [
        (status(1, state="running", departed={"4": 3}), "refused"),  # 4 is no neighbour of 1
        ((TP.status(1), b'{"v":1,"node":1,"state":"running","departed":{"abc":3}}'), "refused"),
        (status(1, state="running", iterations=21), "refused"),
        (status(1, state="leaving", iterations=P + 1), "taken"),  # its own word: gone from P + 1
        (s.x(1, P, honest(1, P)), "taken"),
        (s.x(1, P + 1, honest(1, P + 1)), "refused"),
    ]


def z0(frm: int, to: int, group: str, z: float) -> tuple[str, bytes]:
    return TP.z0(frm, to), encode(Z0Msg.model_validate({"from": frm, "to": to, "group": group, "z": z}))


def z0_exchange(s: Sides) -> list[Step]:
    return [
        (z0(3, 0, s.group, 1.0), "refused", (0,)),  # 3-0 is no edge of the ring
        (z0(1, 0, "nope", 1.0), "refused", (0,)),
        (z0(1, 0, s.group, 1.0), "taken", (0,)),
        (z0(1, 0, s.group, 1.0), "dup", (0,)),
        (z0(1, 0, s.group, 2.0), "equivocation", (0,)),
    ]


@pytest.mark.parametrize(
    "sequence",
    [
        forged_in_window,
        duplicates_and_conflicts,
        out_of_the_run,
        impossible_stop,
        departure_claims,
        z0_exchange,
    ],
    ids=lambda f: f.__name__,
)
async def test_the_nodes_and_the_transcript_decide_alike(sides: Sides, sequence: object) -> None:
    assert callable(sequence)
    for step in sequence(sides):
        (topic, payload), expected = step[0], step[1]
        at = step[2] if len(step) > 2 else RECEIVERS
        assert sides.decide(topic, payload, at) == {expected}, (payload, expected)


async def test_receivers_apart_the_transcript_keeps_what_every_receiver_takes(sides: Sides) -> None:
    """Node 0 one iteration ahead of node 2: a forged x_1^(P+2) lies in node 0's window only. Node 0
    takes it, node 2 refuses it, and so does the transcript, which stores an x only if every
    receiver's window holds it (the real x_1^(P+2) is then a conflict node 0 reports: an
    equivocation the receivers see, see docs/protocol.md, "Acceptance: one rule")."""
    for k in (1, 5):
        topic, payload = sides.x(k, P, honest(k, P))
        sides.transcript.add(topic, payload)
        sides.nodes[0].feed(Message(topic, payload))
    await sides.nodes[0].member.x_in.take(P)
    assert sides.transcript.add(*sides.x(0, P + 1, honest(0, P + 1))) is not None
    topic, payload = sides.x(1, P + 2, 42.0)
    made = [sides.node_decides(sides.nodes[i], topic, payload) for i in RECEIVERS]
    assert made == ["taken", "refused"]
    assert sides.transcript_decides(topic, payload) == "refused"
