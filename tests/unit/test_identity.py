"""Signed messages and equivocation: the protocol's rule, the nodes and the transcript on one memory broker.

* sign/verify (:mod:`nlagg_node.protocol.identity`): what a node signs verifies; another topic, another
  key, a changed byte, a missing or misplaced signature do not; unsigned payloads are byte for byte
  as in a run without identities; an x's key-chain element (:mod:`nlagg_node.protocol.chain`) is
  checked with one hash, and nothing off the chain passes;
* a network with identities is the simulator's, bit for bit, and refuses what a password holder forges;
* a conflict for one slot ends the run naming the node (:mod:`nlagg_node.protocol.equivocation`), signed
  (proof) or not (a lab run), and the transcript stores the second message as rejected naming it too.
"""

from __future__ import annotations

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
from nlagg_node.protocol import (
    Identity,
    Verifier,
    instance_error,
    new_identity,
    new_instance,
    signature_error,
)
from nlagg_node.protocol.chain import ChainCheck, KeyChain, key_b64
from nlagg_node.runtime.checkpoint import CheckpointStore
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import Node, build_config_msg, run_edges
from nlagg_node.runtime.transport import Message
from nlagg_node.runtime.wire import StatusMsg, Z0Msg, decode, encode, encode_x, topics
from nlagg_node.sim import simulate
from tests.harness.signednet import memory_network, run_network

RUN = "auth"
TP = topics("nlagg", RUN)
CFG = RunConfig(op="median", n=6, trials=1, t_max=60, seed=7, record="all", early_stop=False)
IDS = [new_identity() for _ in range(CFG.n)]
KEYS = [identity.public for identity in IDS]


def test_what_a_node_signs_verifies_and_nothing_else() -> None:
    body = encode(StatusMsg(node=1, state="running"))
    signed = IDS[1].sign(TP.status(1), body)
    assert signed.startswith(body[:-1])
    msg = decode(TP.status(1), signed, "nlagg", RUN)[1]
    assert isinstance(msg, StatusMsg)
    assert msg.sig is not None  # the models take the field
    check = Verifier(KEYS).check
    assert check(TP.status(1), 1, signed) is None
    assert "does not verify" in str(check(TP.status(2), 1, signed))  # bound to its topic
    assert "does not verify" in str(check(TP.status(1), 1, IDS[2].sign(TP.status(1), body)))  # another key
    tampered = signed.replace(b"running", b"leaving")
    assert "does not verify" in str(check(TP.status(1), 1, tampered))
    assert "unsigned" in str(check(TP.status(1), 1, body))
    moved = b'{"sig":' + signed[signed.index(b'"sig":') + 6 : -1] + b"," + body[1:]  # not the last field
    assert "unsigned" in str(check(TP.status(1), 1, moved))
    assert Identity.from_pem(IDS[1].pem()).sign(TP.status(1), body) == signed  # deterministic, from its PEM


def test_a_key_chain_authenticates_each_x_with_one_hash() -> None:
    chain = KeyChain(IDS[1].chain_seed(f"nlagg|{RUN}|1"), 6000)
    assert KeyChain(IDS[1].chain_seed(f"nlagg|{RUN}|1"), 6000).key(1234) == chain.key(1234)  # a resumed node
    check = ChainCheck(chain.anchor, far={5000: 5001})
    assert all(check.check(t, key_b64(chain.key(t))) is None for t in range(300))
    assert check.check(120, key_b64(chain.key(120))) is None  # a resend, behind the latest
    assert check.check(299, key_b64(chain.key(299))) is None
    assert "not on the sender's key chain" in str(check.check(300, key_b64(chain.key(301))))
    assert "not on the sender's key chain" in str(check.check(300, key_b64(bytes(16))))
    assert "no key-chain element" in str(check.check(300, None))
    assert "cannot be checked" in str(check.check(5999, key_b64(chain.key(5999))))  # too far to hash
    assert check.check(5000, key_b64(chain.key(5000))) is None  # a phase start: allowed to jump
    assert check.check(5001, key_b64(chain.key(5001))) is None
    other = KeyChain(IDS[2].chain_seed(f"nlagg|{RUN}|1"), 6000)
    assert "not on the sender's key chain" in str(ChainCheck(chain.anchor).check(0, key_b64(other.key(0))))


def test_without_identities_payloads_are_as_before_and_a_signature_is_refused() -> None:
    status = StatusMsg(node=1, state="online")
    assert encode(status) == b'{"v":1,"node":1,"state":"online","final":null,"output":null,"iterations":null}'
    plain = build_config_msg(CFG, RUN, run_edges(CFG))
    assert b"identities" not in encode(plain)
    signed = IDS[1].sign(TP.status(1), encode(status))
    assert "without identities" in str(signature_error(None, TP.status(1), 1, signed, signed=True))
    assert signature_error(None, TP.status(1), 1, encode(status), signed=False) is None


async def test_a_signed_network_is_the_simulator_and_refuses_forgeries() -> None:
    sim = simulate(CFG)
    broker = MemoryBroker()
    route = broker.route
    forged: list[bytes] = []

    def forge(topic: str, payload: bytes, retain: bool) -> None:
        if topic == TP.x(1) and not forged:  # node 1's password, not its key: one forgery first
            t = json.loads(payload)["t"]
            forged.append(encode_x(node=1, t=t, phase="median", x=1e6))
            route(topic, forged[0], retain)
        route(topic, payload, retain)

    broker.route = forge  # type: ignore[method-assign]
    tasks = await run_network(memory_network(CFG, broker, RUN, IDS))
    results = [task.result() for task in tasks]
    assert np.array_equal(np.array([r.x for r in results]).T, sim.recorded_x[:, 0, :])
    nbrs_of_1 = [i for i, r in enumerate(results) if 1 in _neighbours(i)]
    assert all(results[i].rejected >= 1 for i in nbrs_of_1)


def _neighbours(i: int) -> set[int]:
    return {int(b) if a == i else int(a) for a, b in run_edges(CFG).tolist() if i in (a, b)}


def _other(topic: str, payload: bytes, signed: bool) -> bytes:
    """The same message with another number (an x keeps its key-chain element), signed anew by node 3."""
    body = json.loads(payload)
    field = "x" if "x" in body else "z"
    body[field] += 1.0
    if not signed:
        return json.dumps(body, separators=(",", ":")).encode()
    del body["sig"]
    return IDS[3].sign(topic, json.dumps(body, separators=(",", ":")).encode())


@pytest.mark.parametrize(
    ("kind", "signed"),
    [("x", True), ("x", False), ("z0", True)],
    ids=["x-signed-proof", "x-lab-no-identities", "z0-signed-proof"],
)
async def test_an_equivocating_node_ends_the_run_naming_it(kind: str, signed: bool) -> None:
    broker = MemoryBroker()
    route = broker.route
    target = TP.x(3) if kind == "x" else TP.z0(3, min(_neighbours(3)))

    def equivocate(topic: str, payload: bytes, retain: bool) -> None:
        route(topic, payload, retain)
        if topic == target and json.loads(payload).get("t", 10) == 10:  # node 3 sends another one
            route(topic, _other(topic, payload, signed), retain)

    broker.route = equivocate  # type: ignore[method-assign]
    nodes = memory_network(CFG, broker, RUN, IDS if signed else None)
    with pytest.raises(ExceptionGroup) as caught:
        await run_network(nodes)
    errors = [e for e in caught.value.exceptions if isinstance(e, EquivocationError)]
    assert errors, caught.value.exceptions
    assert {e.node for e in errors} == {3}
    slot = "x_3^(10)" if kind == "x" else "z0 3->"
    assert all(slot in str(e) for e in errors)
    assert all(("node 3 equivocated" in str(e)) == signed for e in errors)  # proof: signed pairs


async def test_a_copied_x_with_another_number_is_refused_and_the_run_goes_on() -> None:
    """The element of node 3's real x^(10) on another number, its signature kept: a copy (before x's
    were signed every node stopped the run for it, and nothing proved who sent which)."""
    broker = MemoryBroker()
    route = broker.route

    def copy(topic: str, payload: bytes, retain: bool) -> None:
        route(topic, payload, retain)
        if topic == TP.x(3) and json.loads(payload).get("t") == 10:
            body = json.loads(payload)
            body["x"] += 1.0
            route(topic, json.dumps(body, separators=(",", ":")).encode(), retain)

    broker.route = copy  # type: ignore[method-assign]
    results = [task.result() for task in await run_network(memory_network(CFG, broker, RUN, IDS))]
    assert np.array_equal(np.array([r.x for r in results]).T, simulate(CFG).recorded_x[:, 0, :])
    assert all(results[i].rejected >= 1 for i in _neighbours(3))


def test_the_transcript_refuses_forgeries_and_names_an_equivocation(tmp_path: Path) -> None:
    cfg = CFG.model_copy(update={"init_channel": "plain"})
    edges = run_edges(cfg)
    chains = [KeyChain(IDS[k].chain_seed(f"nlagg|{RUN}|{k}"), 60) for k in range(cfg.n)]

    def x(k: int, t: int, value: float, key: int | None = None, signer: int | None = None) -> bytes:
        body = encode_x(
            node=k, t=t, phase="median", x=value, k=key_b64(chains[k].key(t if key is None else key))
        )
        return IDS[k if signer is None else signer].sign(TP.x(k), body)

    with Transcript(tmp_path / "t.sqlite", run_id=RUN) as tr:
        tr.add(TP.config, encode(build_config_msg(cfg, RUN, edges, KEYS)), retained=True)
        for k in range(cfg.n):
            online = encode(StatusMsg(node=k, state="online", chain=key_b64(chains[k].anchor)))
            assert tr.add(TP.status(k), IDS[k].sign(TP.status(k), online)) is not None
        assert all(tr.add(TP.x(k), x(k, 0, 0.5)) is not None for k in range(cfg.n))
        assert (
            tr.add(TP.x(1), encode_x(node=1, t=1, phase="median", x=9.0)) is None
        )  # a broker password's forgery
        assert tr.add(TP.x(1), x(1, 1, 9.0, key=2)) is None  # another iteration's element
        assert tr.add(TP.x(1), x(1, 1, 0.5)) is not None
        assert tr.add(TP.x(1), x(1, 1, 0.75, signer=2)) is None  # the same element, not signed by 1: a copy
        assert tr.add(TP.x(1), x(1, 1, 0.875)) is None  # node 1's own signature: proof
        z0 = encode(Z0Msg.model_validate({"from": 1, "to": 0, "group": "median", "z": 1.5}))
        assert tr.add(TP.z0(1, 0), IDS[1].sign(TP.z0(1, 0), z0)) is not None
        assert tr.add(TP.z0(1, 0), z0) is None  # unsigned
        other = z0.replace(b"1.5", b"2.5")
        assert tr.add(TP.z0(1, 0), IDS[1].sign(TP.z0(1, 0), other)) is None  # signed: proof
        reasons = [why for _, why in tr.rejected()]
    with Transcript(tmp_path / "t.sqlite", run_id=RUN) as tr:  # a restarted eavesdropper follows the chains
        assert tr.add(TP.x(4), x(4, 1, 0.5)) is not None
        assert tr.add(TP.x(2), x(2, 1, 0.5)) is not None
        assert tr.add(TP.x(3), x(3, 1, 0.5, key=2)) is None
    assert "is unsigned" in reasons[0]
    assert "not on the sender's key chain" in reasons[1]
    assert "x_1^(1) conflicts with the one taken and is not node 1's" in reasons[2]
    assert "node 1 equivocated: two different x_1^(1), both signed" in reasons[3]
    assert "unsigned message" in reasons[4]
    assert "node 1 equivocated: two different z0 1->0 (median)" in reasons[5]


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
    node = memory_network(CFG, MemoryBroker(), RUN, IDS)[0]
    nbr = sorted(_neighbours(0))[0]
    other = sorted(_neighbours(0))[1]
    payload = IDS[nbr].sign(TP.status(nbr), encode(StatusMsg(node=nbr, state="online")))
    before = node.rejected
    node.feed(Message(TP.status(other), payload.replace(b'"node":%d' % nbr, b'"node":%d' % other)))
    assert node.rejected == before + 1


def test_a_message_of_another_run_instance_is_refused_by_name() -> None:
    first, second = new_instance(), new_instance()
    body = encode(StatusMsg(node=1, state="online"))
    old = IDS[1].sign(TP.status(1), body, first)
    assert Verifier(KEYS, first).check(TP.status(1), 1, old) is None
    why = Verifier(KEYS, second).check(TP.status(1), 1, old)
    assert why is not None
    assert "replayed from another start of the run" in why
    assert Verifier(KEYS, second).check(TP.status(1), 1, IDS[1].sign(TP.status(1), body, second)) is None
    # Without an instance (the lab testbed) the signed bytes are as before.
    assert Verifier(KEYS).check(TP.status(1), 1, IDS[1].sign(TP.status(1), body)) is None


def test_a_plans_launcher_signs_a_fresh_instance_the_nodes_check(tmp_path: Path) -> None:
    run = load_config(None, op="max", n=4, graph="ring")
    plan = build_plan(PlanSpec(run=run, run_id="r1", seed=7))
    write_plan(plan, tmp_path / "plan")
    table = tomllib.loads((tmp_path / "plan" / "run.toml").read_text())["identities"]
    launcher = Identity.from_pem((tmp_path / "plan" / "secrets" / "launcher.identity.pem").read_bytes())
    assert table["launcher"] == launcher.public
    topic = topics("nlagg", "r1").config
    instance = new_instance()
    msg = build_config_msg(run, "r1", run_edges(run), KEYS, instance=instance, launcher=launcher.public)
    signed = launcher.sign(topic, encode(msg))
    assert instance_error(topic, signed, launcher.public, instance) is None
    assert "not signed" in str(instance_error(topic, encode(msg), launcher.public, instance))
    forged = new_identity().sign(topic, encode(msg))
    assert "does not verify" in str(instance_error(topic, forged, launcher.public, instance))
    assert "no run instance" in str(instance_error(topic, signed, launcher.public, None))


def test_a_checkpoint_of_another_start_is_discarded(tmp_path: Path) -> None:
    first, second = new_instance(), new_instance()
    store = CheckpointStore(tmp_path, "r1", 0)
    store.save_instance(first)
    store.path.write_text('{"stage": "x"}')
    assert store.saved_instance(unfinished=True) == first
    store.save_instance(second)  # a new start: the earlier start's checkpoint goes
    assert not store.path.exists()
    assert store.saved_instance() is None
