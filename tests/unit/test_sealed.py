"""Sealed initialization (protocol v2): z^(0) sealed per edge, what nodes refuse, what the attack learns."""

from __future__ import annotations

import base64
import logging
import math
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from adversary.attack import attack_transcript
from adversary.simulated import write_sim_transcript
from nlagg_node.config import RunConfig
from nlagg_node.errors import WireError
from nlagg_node.runtime.member import Member
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.public import run_edges
from nlagg_node.runtime.routing import Router
from nlagg_node.runtime.seal import EdgeCipher, SealError, new_key, public_bytes, shared_secret
from nlagg_node.runtime.transport import Message
from nlagg_node.runtime.wire import KeyMsg, SealedZ0Msg, Z0Msg, decode, encode, topics
from nlagg_node.sim import simulate

RUN = "sealtest"
CFG = RunConfig(op="average", n=4, graph="ring", trials=1, t_max=20, seed=1)  # ring 0-1-2-3-0


def any_key() -> KeyMsg:
    """Node 2's public key (node 1 needs every neighbour's key to seal its z^(0))."""
    return KeyMsg(node=2, key=base64.b64encode(public_bytes(new_key())).decode())


def cipher(
    own: X25519PrivateKey, peer: X25519PrivateKey, run_id: str = RUN, edge: tuple[int, int] = (1, 0)
) -> EdgeCipher:
    shared = shared_secret(own, public_bytes(peer))
    return EdgeCipher(shared, prefix="nlagg", run_id=run_id, sender=edge[0], receiver=edge[1])


@pytest.mark.parametrize("z", [0.1, -0.0, 5e-324, -1.7976931348623157e308, 123.456], ids=str)
def test_sealed_value_opens_to_the_same_bits(z: float) -> None:
    a, b = new_key(), new_key()
    topic = topics("nlagg", RUN).z0(1, 0)
    nonce, ct = cipher(a, b).seal(z, topic, "average")
    back = cipher(b, a).open(nonce, ct, topic, "average")
    assert back == z
    assert math.copysign(1.0, back) == math.copysign(1.0, z)


def test_ciphertexts_differ_between_seals_of_one_value() -> None:
    a, b = new_key(), new_key()
    topic = topics("nlagg", RUN).z0(1, 0)
    assert cipher(a, b).seal(1.5, topic, "g") != cipher(a, b).seal(1.5, topic, "g")  # OS nonces


class Pair:
    """Node 0 of a sealed 4-ring and its neighbour 1, each with its own key, both keys exchanged."""

    def __init__(self) -> None:
        broker = MemoryBroker()
        self.m0 = Member(CFG, 0, 0.5, MemoryTransport(broker, "a"), run_id=RUN)
        self.m1 = Member(CFG, 1, 0.7, MemoryTransport(broker, "b"), run_id=RUN)
        self.router = Router([self.m0], on_reject=lambda topic, exc: self.m0.reject(str(exc)))
        assert self.m0.keys is not None
        assert self.m1.keys is not None
        self.m1.on_key(KeyMsg(node=0, key=self.m0.keys.public))
        self.m1.on_key(any_key())
        self.feed(topics("nlagg", RUN).key(1), encode(KeyMsg(node=1, key=self.m1.keys.public)))
        self.topic = topics("nlagg", RUN).z0(1, 0)

    def feed(self, topic: str, payload: bytes) -> None:
        self.router.feed(Message(topic, payload))

    def sealed(self, z: float = 2.5, group: str = "average") -> SealedZ0Msg:
        _, msg = decode(self.topic, self.m1.z0_payloads(group, [z, 0.0])[0], "nlagg", RUN)
        assert isinstance(msg, SealedZ0Msg)
        return msg


def test_good_sealed_z0_is_taken_and_its_copy_is_a_duplicate() -> None:
    pair = Pair()
    payload = encode(pair.sealed())
    pair.feed(pair.topic, payload)
    pair.feed(pair.topic, payload)
    assert (pair.m0.rejected, pair.m0.duplicates) == (0, 1)


def _tampered(pair: Pair) -> SealedZ0Msg:
    msg = pair.sealed()
    raw = bytearray(base64.b64decode(msg.ct))
    raw[0] ^= 1
    return msg.model_copy(update={"ct": base64.b64encode(bytes(raw)).decode()})


def _wrong_key(pair: Pair) -> SealedZ0Msg:
    nonce, ct = cipher(new_key(), new_key(), edge=(1, 0)).seal(2.5, pair.topic, "average")
    return pair.sealed().model_copy(update={"nonce": nonce, "ct": ct})


def _other_run(pair: Pair) -> SealedZ0Msg:
    m1_other = Member(CFG, 1, 0.7, MemoryTransport(MemoryBroker(), "c"), run_id="another")
    assert pair.m0.keys is not None
    m1_other.on_key(KeyMsg(node=0, key=pair.m0.keys.public))
    m1_other.on_key(any_key())
    _, msg = decode(topics("nlagg", "another").z0(1, 0), m1_other.z0_payloads("average", [2.5, 0.0])[0],
                    "nlagg", "another")  # fmt: skip
    assert isinstance(msg, SealedZ0Msg)
    return msg  # node 1's key differs too, but even the right key would not open it (run bound)


@pytest.mark.parametrize(
    "forge", [_tampered, _wrong_key, _other_run], ids=["tampered", "wrong-key", "other-run"]
)
def test_sealed_z0_that_does_not_authenticate_is_rejected_and_named(
    forge: object, caplog: pytest.LogCaptureFixture
) -> None:
    pair = Pair()
    msg = forge(pair)  # type: ignore[operator]
    with caplog.at_level(logging.WARNING, logger="nlagg.node"):
        pair.feed(pair.topic, encode(msg))
    assert pair.m0.rejected == 1
    assert "does not authenticate" in caplog.text
    pair.feed(pair.topic, encode(pair.sealed()))  # the genuine one still counts afterwards
    assert (pair.m0.rejected, pair.m0.duplicates) == (1, 0)


def test_replay_from_the_opposite_direction_does_not_authenticate() -> None:
    a, b = new_key(), new_key()
    t = topics("nlagg", RUN)
    nonce, ct = cipher(a, b, edge=(1, 0)).seal(2.5, t.z0(1, 0), "average")
    with pytest.raises(SealError, match="does not authenticate"):
        cipher(b, a, edge=(0, 1)).open(nonce, ct, t.z0(0, 1), "average")
    with pytest.raises(SealError):  # same edge, another dual group
        cipher(b, a, edge=(1, 0)).open(nonce, ct, t.z0(1, 0), "max")


def test_plaintext_z0_of_a_sealed_group_is_refused_naming_the_version(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pair = Pair()
    plain = Z0Msg.model_validate({"from": 1, "to": 0, "group": "average", "z": 2.5})
    with caplog.at_level(logging.WARNING, logger="nlagg.node"):
        pair.feed(pair.topic, encode(plain))
    assert pair.m0.rejected == 1
    assert "plaintext (protocol v1)" in caplog.text
    assert "init_channel=auto" in caplog.text


def test_a_key_that_changes_mid_run_is_rejected(caplog: pytest.LogCaptureFixture) -> None:
    pair = Pair()
    other = KeyMsg(node=1, key=base64.b64encode(public_bytes(new_key())).decode())
    with caplog.at_level(logging.WARNING, logger="nlagg.node"):
        pair.feed(topics("nlagg", RUN).key(1), encode(other))
    assert pair.m0.rejected == 1
    assert "key changed mid-run" in caplog.text
    pair.feed(pair.topic, encode(pair.sealed()))  # the first key still opens node 1's z^(0)
    assert pair.m0.rejected == 1


def test_sealed_z0_before_the_key_waits_for_it() -> None:
    broker = MemoryBroker()
    m0 = Member(CFG, 0, 0.5, MemoryTransport(broker, "a"), run_id=RUN)
    m1 = Member(CFG, 1, 0.7, MemoryTransport(broker, "b"), run_id=RUN)
    assert m0.keys is not None
    assert m1.keys is not None
    m1.on_key(KeyMsg(node=0, key=m0.keys.public))
    m1.on_key(any_key())
    payload = m1.z0_payloads("average", [2.5, 0.0])[0]
    _, msg = decode(topics("nlagg", RUN).z0(1, 0), payload, "nlagg", RUN)
    assert isinstance(msg, SealedZ0Msg)
    m0.on_sealed_z0(msg)
    m0.on_key(KeyMsg(node=1, key=m1.keys.public))
    m0.on_sealed_z0(msg)
    assert (m0.rejected, m0.duplicates) == (0, 1)  # opened when the key came; the second is a copy


@pytest.mark.parametrize(
    ("field", "payload"),
    [
        ("nonce", b'{"v":2,"from":1,"to":0,"group":"average","nonce":"AAAA","ct":"' + b"A" * 32 + b'"}'),
        ("ct", b'{"v":2,"from":1,"to":0,"group":"average","nonce":"' + b"A" * 16 + b'","ct":"!!"}'),
        ("z", b'{"v":2,"from":1,"to":0,"group":"average","z":1.0}'),
    ],
    ids=["short-nonce", "bad-ct", "v2-with-plain-z"],
)
def test_malformed_sealed_messages_name_the_field(field: str, payload: bytes) -> None:
    with pytest.raises(WireError) as err:
        decode(topics("nlagg", RUN).z0(1, 0), payload, "nlagg", RUN)
    assert field in str(err.value)


def _components_after(n: int, edges: np.ndarray, corrupted: set[int]) -> list[set[int]]:
    g = nx.Graph()
    g.add_nodes_from(i for i in range(n) if i not in corrupted)
    g.add_edges_from((int(a), int(b)) for a, b in edges if a not in corrupted and b not in corrupted)
    return [set(c) for c in nx.connected_components(g)]


@pytest.mark.parametrize("seed", [0, 1, 3], ids=["seed0", "seed1", "seed3"])
def test_attack_recovers_exactly_what_the_threat_model_allows(seed: int, tmp_path: Path) -> None:
    """Ring of 9, nodes 0, 2, 5 corrupted: honest components {1} (size 1), {3, 4} and {6, 7, 8}.

    Theory (ideal world of the trimmed mean): corrupted values, the trimmed extremes, and an honest
    component whose sum with the known values pins a value. These seeds keep every component of
    size > 1 with at least two unknown values, so only the component of one node is pinned.
    """
    cfg = RunConfig(
        op="trimmed-mean",
        n=9,
        graph="ring",
        k=1,
        trials=1,
        t_max=1500,
        avg_t_max=200,
        record="all",
        seed=seed,
    )
    corrupted = {0, 2, 5}
    res = simulate(cfg)
    rank = res.rank[0]
    extremes = {i for i in range(cfg.n) if rank[i] in (0, cfg.n - 1)}
    comps = _components_after(cfg.n, res.graphs[0], corrupted)
    assert sorted(len(c) for c in comps) == [1, 2, 3]
    assert all(len(c - extremes) >= 2 for c in comps if len(c) > 1)  # nothing else pinned by a sum
    singles = {i for c in comps if len(c) == 1 for i in c}
    report = attack_transcript(write_sim_transcript(res, tmp_path / "t.sqlite", corrupted=sorted(corrupted)))
    assert set(report.exposed) == (singles | extremes) - corrupted
    assert {f.node for f in report.findings if f.status == "corrupted"} == corrupted
    assert report.precision == 1.0
    plain = attack_transcript(
        write_sim_transcript(
            simulate(cfg.model_copy(update={"init_channel": "plain"})), tmp_path / "p.sqlite",
            corrupted=sorted(corrupted),
        )
    )  # fmt: skip
    assert set(plain.exposed) == set(range(cfg.n)) - corrupted


def test_sealed_transcript_holds_no_average_dual(tmp_path: Path) -> None:
    from adversary.transcript import Transcript

    cfg = RunConfig(op="trimmed-mean", n=7, k=1, trials=1, t_max=60, avg_t_max=30, record="all", seed=2)
    path = write_sim_transcript(simulate(cfg), tmp_path / "t.sqlite")
    with Transcript.open_read_only(path) as tr:
        assert sorted(tr.z0(cfg.n, run_edges(cfg))) == ["max", "min"]
