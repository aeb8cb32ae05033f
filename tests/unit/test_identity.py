"""Signed messages and equivocation: the protocol's rule, the nodes and the transcript on one memory broker.

* sign/verify (:mod:`nlagg_node.protocol.identity`): what a node signs verifies; another topic, another
  key, a changed byte, a missing or misplaced signature do not; unsigned payloads are byte for byte
  as in a run without identities;
* a network with identities is the simulator's, bit for bit, and refuses what a password holder forges;
* a conflict for one slot ends the run naming the node (:mod:`nlagg_node.protocol.equivocation`), signed
  (proof) or not (a lab run), and the transcript stores the second message as rejected naming it too.
"""

from __future__ import annotations

import asyncio
import json
import stat
import tomllib
from pathlib import Path

import numpy as np
import pytest

from adversary.transcript import Transcript
from nlagg_node.config import RunConfig, load_config
from nlagg_node.deploy import PlanSpec, build_plan, write_plan
from nlagg_node.errors import ConfigError, EquivocationError
from nlagg_node.protocol import Identity, Verifier, new_identity, signature_error
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import Node, build_config_msg, run_edges
from nlagg_node.runtime.transport import Message
from nlagg_node.runtime.wire import StatusMsg, XMsg, decode, encode, encode_x, topics
from nlagg_node.sim import simulate

RUN = "auth"
TP = topics("nlagg", RUN)
CFG = RunConfig(op="median", n=6, trials=1, t_max=60, seed=7, record="all", early_stop=False)
IDS = [new_identity() for _ in range(CFG.n)]
KEYS = [identity.public for identity in IDS]


def test_what_a_node_signs_verifies_and_nothing_else() -> None:
    body = encode_x(1, 5, "median", 0.25)
    signed = IDS[1].sign(TP.x(1), body)
    assert signed.startswith(body[:-1])
    msg = decode(TP.x(1), signed, "nlagg", RUN)[1]
    assert isinstance(msg, XMsg)
    assert msg.sig is not None  # the models take the field
    check = Verifier(KEYS).check
    assert check(TP.x(1), 1, signed) is None
    assert "does not verify" in str(check(TP.x(2), 1, signed))  # bound to its topic
    assert "does not verify" in str(check(TP.x(1), 1, IDS[2].sign(TP.x(1), body)))  # another key
    tampered = signed.replace(b"0.25", b"0.26")
    assert "does not verify" in str(check(TP.x(1), 1, tampered))
    assert "unsigned" in str(check(TP.x(1), 1, body))
    moved = b'{"sig":' + signed[signed.index(b'"sig":') + 6 : -1] + b"," + body[1:]  # not the last field
    assert "unsigned" in str(check(TP.x(1), 1, moved))
    assert Identity.from_pem(IDS[1].pem()).sign(TP.x(1), body) == signed  # deterministic, from its PEM


def test_without_identities_payloads_are_as_before_and_a_signature_is_refused() -> None:
    status = StatusMsg(node=1, state="online")
    assert encode(status) == b'{"v":1,"node":1,"state":"online","final":null,"output":null,"iterations":null}'
    plain = build_config_msg(CFG, RUN, run_edges(CFG))
    assert b"identities" not in encode(plain)
    signed = IDS[1].sign(TP.status(1), encode(status))
    assert "without identities" in str(signature_error(None, TP.status(1), 1, signed, signed=True))
    assert signature_error(None, TP.status(1), 1, encode(status), signed=False) is None


def _network(
    broker: MemoryBroker, identities: list[str] | None, ids: list[Identity] | None = None
) -> list[Node]:
    edges = run_edges(CFG)
    values = simulate(CFG).values[0]
    return [
        Node(
            CFG,
            i,
            values[i],
            MemoryTransport(broker, f"n{i}"),
            run_id=RUN,
            edges=edges,
            identities=identities,
            identity=None if ids is None else ids[i],
        )
        for i in range(CFG.n)
    ]


async def _run(nodes: list[Node]) -> list[asyncio.Task[object]]:
    async with asyncio.TaskGroup() as tg:
        for nd in nodes:
            await nd.__aenter__()
        return [tg.create_task(nd.run()) for nd in nodes]


async def test_a_signed_network_is_the_simulator_and_refuses_forgeries() -> None:
    sim = simulate(CFG)
    broker = MemoryBroker()
    route = broker.route
    forged: list[bytes] = []

    def forge(topic: str, payload: bytes, retain: bool) -> None:
        if topic == TP.x(1) and not forged:  # node 1's password, not its key: one forgery first
            t = json.loads(payload)["t"]
            forged.append(encode_x(1, t, "median", 1e6))
            route(topic, forged[0], retain)
        route(topic, payload, retain)

    broker.route = forge  # type: ignore[method-assign]
    tasks = await _run(_network(broker, KEYS, IDS))
    results = [task.result() for task in tasks]
    assert np.array_equal(np.array([r.x for r in results]).T, sim.recorded_x[:, 0, :])  # type: ignore[attr-defined]
    nbrs_of_1 = [i for i, r in enumerate(results) if 1 in _neighbours(i)]
    assert all(results[i].rejected >= 1 for i in nbrs_of_1)  # type: ignore[attr-defined]


def _neighbours(i: int) -> set[int]:
    return {int(b) if a == i else int(a) for a, b in run_edges(CFG).tolist() if i in (a, b)}


@pytest.mark.parametrize("signed", [True, False], ids=["signed-proof", "lab-no-identities"])
async def test_an_equivocating_node_ends_the_run_naming_it(signed: bool) -> None:
    broker = MemoryBroker()
    route = broker.route

    def equivocate(topic: str, payload: bytes, retain: bool) -> None:
        route(topic, payload, retain)
        if topic == TP.x(3) and json.loads(payload)["t"] == 10:  # node 3 itself sends another x_3^(10)
            other = encode_x(3, 10, "median", json.loads(payload)["x"] + 1.0)
            route(topic, IDS[3].sign(topic, other) if signed else other, retain)

    broker.route = equivocate  # type: ignore[method-assign]
    nodes = _network(broker, KEYS if signed else None, IDS if signed else None)
    with pytest.raises(ExceptionGroup) as caught:
        await _run(nodes)
    errors = [e for e in caught.value.exceptions if isinstance(e, EquivocationError)]
    assert errors, caught.value.exceptions
    assert {e.node for e in errors} == {3}
    assert all("x_3^(10)" in str(e) for e in errors)
    assert all(("equivocated" in str(e)) == signed for e in errors)  # proof only with identities


def test_the_transcript_refuses_forgeries_and_names_an_equivocation(tmp_path: Path) -> None:
    cfg = CFG.model_copy(update={"init_channel": "plain"})
    edges = run_edges(cfg)
    with Transcript(tmp_path / "t.sqlite", run_id=RUN) as tr:
        tr.add(TP.config, encode(build_config_msg(cfg, RUN, edges, KEYS)), retained=True)
        x0 = [(TP.x(k), IDS[k].sign(TP.x(k), encode_x(k, 0, "median", 0.5))) for k in range(cfg.n)]
        assert all(tr.add(topic, payload) is not None for topic, payload in x0)
        forged = encode_x(1, 1, "median", 9.0)
        assert tr.add(TP.x(1), forged) is None
        assert tr.add(TP.x(1), IDS[2].sign(TP.x(1), forged)) is None
        assert tr.add(TP.x(1), IDS[1].sign(TP.x(1), encode_x(1, 1, "median", 0.5))) is not None
        assert tr.add(TP.x(1), IDS[1].sign(TP.x(1), encode_x(1, 1, "median", 0.75))) is None
        reasons = [why for _, why in tr.rejected()]
    assert "unsigned message" in reasons[0]
    assert "does not verify with node 1's identity" in reasons[1]
    assert "node 1 equivocated: two different x_1^(1)" in reasons[2]


def test_a_plan_gives_every_node_an_identity(tmp_path: Path) -> None:
    run = load_config(None, op="max", n=4, graph="ring")
    out = tmp_path / "plan"
    write_plan(build_plan(PlanSpec(run=run, run_id="r1", seed=7)), out)
    keys = tomllib.loads((out / "run.toml").read_text())["identities"]["ed25519"]
    for i in range(4):
        node = tomllib.loads((out / "nodes" / f"{i}.toml").read_text())
        key_file = out / node["signing_key"]
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        assert Identity.from_pem(key_file.read_bytes()).public == keys[i]
    plain = tmp_path / "plain"
    write_plan(build_plan(PlanSpec(run=run, run_id="r1", seed=7, auth=False)), plain)
    assert "identities" not in tomllib.loads((plain / "run.toml").read_text())
    assert not list((plain / "secrets").glob("*.identity.pem"))


def test_a_node_refuses_a_key_that_is_not_its_identity() -> None:
    broker = MemoryBroker()
    with pytest.raises(ConfigError, match="signing_key"):
        Node(CFG, 0, 0.5, MemoryTransport(broker, "n0"), run_id=RUN, identities=KEYS, identity=IDS[1])
    with pytest.raises(ConfigError, match="signing_key"):
        Node(CFG, 0, 0.5, MemoryTransport(broker, "n0"), run_id=RUN, identities=KEYS)


def test_a_status_replayed_on_another_node_topic_is_refused() -> None:
    node = _network(MemoryBroker(), KEYS, IDS)[0]
    nbr = sorted(_neighbours(0))[0]
    other = sorted(_neighbours(0))[1]
    payload = IDS[nbr].sign(TP.status(nbr), encode(StatusMsg(node=nbr, state="online")))
    before = node.rejected
    node.feed(Message(TP.status(other), payload.replace(b'"node":%d' % nbr, b'"node":%d' % other)))
    assert node.rejected == before + 1
