"""The certified stop (max and min) at the node runtime: every x's fields as
:func:`~nlagg_node.protocol.fields_along` gives them, the same stop, and the true extremum as
every node's output, bit for bit; the ``cand`` field on the wire and its acceptance."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from adversary.attack import attack_transcript
from adversary.capture.eavesdropper import Eavesdropper
from adversary.simulated import attack_simulation, write_sim_transcript
from adversary.transcript import Transcript
from nlagg_node.config import RunConfig
from nlagg_node.protocol import RunShape, fields_along, x_form_error
from nlagg_node.runtime.checkpoint import CheckpointStore
from nlagg_node.runtime.hosted import host_nodes
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import Node, NodeResult, run_edges
from nlagg_node.runtime.public import build_config_msg
from nlagg_node.runtime.wire import (
    HotDecoder,
    WireError,
    XMsg,
    decode,
    encode,
    encode_x,
    topics,
)
from nlagg_node.sim import draw_values, simulate
from nlagg_node.termination import NO_STOP, Certificate, certificate_sign, stop_reach
from tests.harness.crash import crash_when
from tests.harness.departures import RUN, run_with_departures
from tests.harness.transcripts import x_payloads

TP = topics("nlagg", RUN)


class RecordingBroker(MemoryBroker):
    """Keeps every message published, in order, and every x payload by ``(node, t)`` (the last copy)."""

    def __init__(self) -> None:
        super().__init__()
        self.xs: dict[tuple[int, int], bytes] = {}
        self.log: list[tuple[str, bytes, bool]] = []

    def route(self, topic: str, payload: bytes, retain: bool) -> None:
        self.log.append((topic, payload, retain))
        self.xs.update(x_payloads(topic, payload, RUN) or {})  # hosted nodes' x's come coalesced
        super().route(topic, payload, retain)


def certified_config(op: str, **extra: object) -> RunConfig:
    cfg = RunConfig(op=op, n=8, trials=1, record="all", t_max=3000, seed=5, stop_window=30, **extra)
    assert cfg.certified
    return cfg


def expected_payloads(
    cfg: RunConfig, published: dict[tuple[int, int], bytes], departed: dict[int, int]
) -> tuple[dict[tuple[int, int], bytes], int, dict[int, float]]:
    """What :func:`fields_along` says each node publishes, given the x's the nodes ``published``:
    every x's payload, the iterations run and each node's last candidate."""
    values = draw_values(cfg.values, cfg.seed, 1, cfg.n)[0]
    edges = run_edges(cfg)
    xs = np.full((1 + max(t for _, t in published), cfg.n), np.nan)
    for (i, t), payload in published.items():
        xs[t, i] = json.loads(payload)["x"]
    reach = stop_reach(cfg.n, edges, cfg.may_depart)
    cert = Certificate(values.tolist(), certificate_sign(cfg.op))
    rows = fields_along(xs, edges, 0, cfg.stop_window_value, reach, cfg.tolerance, departed, cert)
    want: dict[tuple[int, int], bytes] = {}
    cands: dict[int, float] = {}
    for t, row in enumerate(rows):
        for i, fields in enumerate(row):
            if fields is not None:
                k, e, deps, cand = fields
                stop = None if e == NO_STOP else e
                want[i, t] = encode_x(
                    node=i,
                    t=t,
                    phase=cfg.op,
                    x=float(xs[t, i]),
                    quiet=k,
                    stop=stop,
                    departures=deps or None,
                    cand=cand,
                )
                if cand is not None:
                    cands[i] = cand
    return want, len(rows), cands


async def run_hosted(cfg: RunConfig, broker: MemoryBroker, tmp_path: Path | None = None) -> list[NodeResult]:
    values = draw_values(cfg.values, cfg.seed, 1, cfg.n)[0]
    edges = run_edges(cfg)
    async with MemoryTransport(broker, "host") as tr:
        nodes = [
            Node(
                cfg, i, values[i], tr, run_id=RUN, edges=edges, own_transport=False,
                checkpoint=None if tmp_path is None else CheckpointStore(tmp_path, RUN, i),
            )
            for i in range(cfg.n)
        ]  # fmt: skip
        return await host_nodes(nodes, tr, "nlagg", RUN)


@pytest.mark.parametrize(
    ("op", "hosted"),
    [("max", True), ("min", True), ("max", False)],
    ids=["max-hosted", "min-hosted", "max-processes"],
)
async def test_nodes_stop_where_the_rule_says_with_the_exact_extremum(op: str, hosted: bool) -> None:
    cfg = certified_config(op)
    broker = RecordingBroker()
    results = (
        await run_hosted(cfg, broker)
        if hosted
        else await run_with_departures(cfg, {}, killed=False, broker=broker)
    )
    want, ran, cands = expected_payloads(cfg, broker.xs, {})
    assert ran < cfg.t_max_value  # the certificate stopped the phase
    assert broker.xs == want  # every x, fields and candidate included, and no other
    values = draw_values(cfg.values, cfg.seed, 1, cfg.n)[0]
    truth = float(values.max() if op == "max" else values.min())
    assert all(r.iterations == ran for r in results)
    assert all(r.output == [truth] and r.finals == [truth] for r in results)
    assert set(cands.values()) == {truth}
    assert any(abs(r.x[-1] - truth) > 0 for r in results)  # the last x's are not all the output


async def test_a_departed_maximum_leaves_no_candidate_behind() -> None:
    """The maximizer leaves after its value has spread as the candidate: the survivors reset,
    stop on their own maximum and output it exactly, as the rule says."""
    cfg = certified_config("max", may_depart=True)
    values = draw_values(cfg.values, cfg.seed, 1, cfg.n)[0]
    top = int(np.argmax(values))
    probe = RecordingBroker()
    plain = await run_with_departures(cfg, {}, killed=False, broker=probe)
    spread = min(t for (i, t), p in probe.xs.items() if i != top and json.loads(p).get("cand") == values[top])
    departed = {top: spread + 5}
    broker = RecordingBroker()
    results = await run_with_departures(cfg, departed, killed=False, broker=broker)
    want, ran, _ = expected_payloads(cfg, broker.xs, departed)
    assert broker.xs == want
    here = [r for r in results if r.node != top]
    assert ran > len(plain[0].x)  # the departure cost the survivors their candidate
    survivors_max = float(np.delete(values, top).max())
    assert all(r.iterations == ran and r.output == [survivors_max] for r in here)


async def test_a_resumed_host_ends_as_an_uninterrupted_one(tmp_path: Path) -> None:
    """Cancelled once the first candidate is out (the pin run and the candidate are then held
    by few nodes), restarted from the checkpoints: the same x's, fields and output as a run
    without the crash."""
    cfg = certified_config("max")
    clean = RecordingBroker()
    expected = await run_hosted(cfg, clean)
    broker = RecordingBroker()
    run = asyncio.create_task(run_hosted(cfg, broker, tmp_path))
    await crash_when(run, lambda: any(b'"cand"' in p for p in broker.xs.values()))
    results = await run_hosted(cfg, broker, tmp_path)
    assert broker.xs == clean.xs
    assert [(r.x, r.output, r.iterations) for r in results] == [
        (r.x, r.output, r.iterations) for r in expected
    ]


async def test_the_eavesdroppers_output_is_the_certified_one(tmp_path: Path) -> None:
    """The attack on a captured certified run reads each node's output from the candidate it
    stopped with, not from its last x: the true maximum exactly, as the nodes' ``done`` say."""
    cfg = certified_config("max")
    broker = RecordingBroker()
    results = await run_hosted(cfg, broker)
    path = tmp_path / "t.sqlite"
    with Transcript(path, run_id=RUN) as tr:
        eaves = Eavesdropper(MemoryTransport(MemoryBroker(), "eve"), tr)
        eaves.handle(TP.config, encode(build_config_msg(cfg, RUN, run_edges(cfg))), True)
        for topic, payload, retained in broker.log:
            eaves.handle(topic, payload, retained)
        tr.commit()
        assert tr.rejected() == []  # every x, its candidate included, is of the run
    report = attack_transcript(path)
    assert (
        report.output == results[0].output[0] == float(draw_values(cfg.values, cfg.seed, 1, cfg.n)[0].max())
    )


@pytest.mark.parametrize("op", ["max", "min"])
def test_a_simulated_certified_run_is_attacked_with_its_exact_output(tmp_path: Path, op: str) -> None:
    """``nlagg sim --transcript`` of a certified run: the ``done`` finals are the candidates, and the
    attack on the file and on the arrays reads the simulator's exact output."""
    sim = simulate(certified_config(op))
    path = write_sim_transcript(sim, tmp_path / "sim.sqlite", run_id=RUN)
    truth = float(sim.values[0].max() if op == "max" else sim.values[0].min())
    assert (sim.output[0] == truth).all()
    with Transcript.open_read_only(path) as tr:
        finals = {i: st.final for i, st in tr.statuses().items()}
    assert finals == {i: [truth] for i in range(sim.config.n)}
    assert attack_transcript(path).output == attack_simulation(sim).output == truth


@pytest.mark.parametrize("cand", [0.1 + 0.2, -3.5e-300, 1e300, 5.0], ids=["repr", "tiny", "huge", "integral"])
def test_cand_round_trips_exactly_and_encodes_as_json_dumps(cand: float) -> None:
    payload = encode_x(node=2, t=700, phase="max", x=0.75, quiet=31, stop=740, cand=cand)
    body = {"v": 1, "node": 2, "t": 700, "phase": "max", "x": 0.75, "quiet": 31, "stop": 740, "cand": cand}
    assert payload == json.dumps(body, separators=(",", ":")).encode()
    topic = topics("nlagg", "r").x(2)
    _, msg = decode(topic, payload, "nlagg", "r")
    hot = HotDecoder("nlagg", "r")
    hot.decode(topic, payload)  # learns the topic
    _, fast = hot.decode(topic, payload)
    assert isinstance(msg, XMsg)
    assert isinstance(fast, XMsg)
    assert msg.cand == fast.cand == cand


def test_messages_without_cand_are_unchanged() -> None:
    assert (
        encode_x(node=1, t=3, phase="max", x=0.5, quiet=0)
        == b'{"v":1,"node":1,"t":3,"phase":"max","x":0.5,"quiet":0}'
    )


@pytest.mark.parametrize("cand", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_cand_that_is_not_finite_is_refused(cand: float) -> None:
    with pytest.raises(WireError, match="cand"):
        encode_x(node=0, t=3, phase="max", x=1.0, quiet=0, cand=cand)
    body = b'{"v":1,"node":0,"t":3,"phase":"max","x":1.0,"quiet":0,"cand":1e999}'
    with pytest.raises(WireError, match="cand"):
        HotDecoder("nlagg", "r").decode(topics("nlagg", "r").x(0), body)


@pytest.mark.parametrize(
    ("params", "refused"),
    [
        pytest.param({"op": "max"}, False, id="certified"),
        pytest.param({"op": "max", "stop_rule": "tolerance"}, True, id="tolerance"),
        pytest.param({"op": "median"}, True, id="median"),
        pytest.param({"op": "max", "early_stop": False}, True, id="fixed-schedule"),
    ],
)
def test_cand_only_in_a_certified_run(params: dict[str, object], refused: bool) -> None:
    cfg = RunConfig(n=6, trials=1, t_max=50, **params)
    shape = RunShape(cfg, run_edges(cfg))
    quiet = 0 if cfg.early_stop else None
    why = x_form_error(shape, 1, 3, shape.phase_at[3], quiet, None, None, 0.5)
    if refused:
        assert why is not None
        assert "cand" in why
    else:
        assert why is None
    assert x_form_error(shape, 1, 3, shape.phase_at[3], quiet, None, None) is None
