"""Epochs of a continuous deployment over the in-memory transport: exact every epoch, a node absent
for an epoch departs at t = 0 of it and rejoins the next, an overrun skips the starts it missed."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from nlagg_node.config import RunConfig
from nlagg_node.departure import FLAP_LIMIT
from nlagg_node.deploy import epochnode
from nlagg_node.deploy.epochnode import epoch_line
from nlagg_node.errors import ConfigError, DepartedError, NlaggError
from nlagg_node.protocol import Identity, Verifier, new_identity, signature_error
from nlagg_node.runtime.epochdriver import EpochClock, EpochOutcome, run_epoch, run_epochs
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import node_will, run_edges
from nlagg_node.runtime.outputs import (
    EpochOutput,
    append_output,
    epoch_run_id,
    published_record,
    read_outputs,
    results_topic,
    sign_record,
)
from nlagg_node.runtime.result import NodeResult
from nlagg_node.runtime.transport import Will
from nlagg_node.runtime.wire import KeyMsg, StatusMsg, encode
from tests.harness.load import contention, stretched

PREFIX, RUN = "farm", "greenhouse"
EPOCHS = 3


def values_of(epoch: int, n: int) -> np.ndarray:
    """Values that change every epoch (pinned), below the max's from-above start (2.99 without a
    range), as `nlagg node` requires of every value (check_node_value)."""
    return np.random.default_rng([7, epoch]).uniform(1.0, 2.9, n)


async def deployment(
    cfg: RunConfig,
    broker: MemoryBroker,
    absent: dict[int, int],
    stopped: tuple[int, int] | None = None,
    crashed: tuple[int, int] | None = None,
) -> list[list[EpochOutcome]]:
    """Every node runs the epochs; node j of ``absent`` {j: k} cannot read its value in epoch k;
    node j of ``stopped`` (j, k) is told to stop (a SIGTERM) once it published x^(3) of epoch k;
    node j of ``crashed`` (j, k) loses its connection there (its will stays) and is back at k + 1."""
    edges = run_edges(cfg)  # before the clock starts (the first call compiles)
    clock = clock_now()
    stop = asyncio.Event()

    async def node(i: int) -> list[EpochOutcome]:
        async def value_for(k: int) -> float:
            if absent.get(i) == k:
                raise ConfigError("value", "sensor", "no reading")
            return float(values_of(k, cfg.n)[i])

        async def transport_for(k: int, run: str) -> MemoryTransport:
            will = node_will(f"{PREFIX}/{RUN}", run, i, shared=True)
            if crashed == (i, k):
                return CrashesMidEpoch(broker, f"n{i}", will=will, x_topic=f"{PREFIX}/{RUN}/e{k}/node/{i}/x")
            if stopped == (i, k):
                return StopsMidEpoch(
                    broker, f"n{i}", will=will, x_topic=f"{PREFIX}/{RUN}/e{k}/node/{i}/x", stop=stop
                )
            return MemoryTransport(broker, f"n{i}", will=will)

        mine = stop if stopped is not None and stopped[0] == i else None
        out = run_epochs(
            cfg,
            i,
            value_for,
            transport_for,
            clock,
            deployment=(PREFIX, RUN),
            stop=mine,
            edges=edges,
            seed=None,
        )
        return [o async for o in out]

    return list(await asyncio.gather(*(node(i) for i in range(cfg.n))))


class StopsMidEpoch(MemoryTransport):
    """A node's transport that sets ``stop`` (its SIGTERM) when the node publishes its fourth x."""

    def __init__(
        self, broker: MemoryBroker, client_id: str, *, will: Will, x_topic: str, stop: asyncio.Event
    ) -> None:
        super().__init__(broker, client_id, will=will)
        self.x_topic, self.stop, self.sent = x_topic, stop, 0

    def publish_nowait(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        super().publish_nowait(topic, payload, qos=qos, retain=retain)
        if topic == self.x_topic:
            self.sent += 1
            if self.sent == 4:
                self.stop.set()


class CrashesMidEpoch(MemoryTransport):
    """A node's transport lost without a clean close after the node published its fourth x: the
    broker publishes its will and the node's epoch ends there (a SIGKILL, the service restarting)."""

    def __init__(self, broker: MemoryBroker, client_id: str, *, will: Will, x_topic: str) -> None:
        super().__init__(broker, client_id, will=will)
        self.x_topic, self.sent = x_topic, 0

    def publish_nowait(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        super().publish_nowait(topic, payload, qos=qos, retain=retain)
        if topic == self.x_topic:
            self.sent += 1
            if self.sent == 4:
                self.abort()
                raise ConnectionResetError("killed")


def retained_of(n: int, *, sealed: bool = False) -> set[str]:
    """The retained topics of a deployment: each node's status (its key, sealed) and results."""
    kinds = ("status", "key") if sealed else ("status",)
    shared = {f"{PREFIX}/{RUN}/node/{i}/{kind}" for i in range(n) for kind in kinds}
    return shared | {results_topic(PREFIX, RUN, i) for i in range(n)}


def clock_now() -> EpochClock:
    """Epochs every 2.5 s with a 0.6 s join window, both stretched by the machine's contention."""
    load = contention()
    return EpochClock(
        origin=time.time() + 0.2, period=stretched(2.5, load), epochs=EPOCHS, join=stretched(0.6, load)
    )


def record(r: NodeResult) -> EpochOutput:
    return EpochOutput(node=r.node, epoch=0, output=r.output[0], iterations=r.iterations, time=0.0)


def output_of(o: EpochOutcome) -> float:
    assert o.result is not None, o.missed
    return o.result.output[0]


CFG = RunConfig(op="max", n=4, graph="complete", may_depart=True, seed=1)  # 0.5 s an epoch


def test_every_epoch_is_exact_with_changing_values() -> None:
    broker = MemoryBroker()
    runs = asyncio.run(deployment(CFG, broker, {}))
    for k in range(EPOCHS):
        truth = float(values_of(k, CFG.n).max())
        outputs = [output_of(r[k]) for r in runs]
        assert [r[k].epoch for r in runs] == [k] * CFG.n
        assert outputs == pytest.approx([truth] * CFG.n, abs=CFG.tolerance * 10)
    latest = EpochOutput.model_validate_json(broker.retained[results_topic(PREFIX, RUN, 3)])
    assert (latest.node, latest.epoch) == (3, EPOCHS - 1)
    assert set(broker.retained) == retained_of(CFG.n)  # the same topics, whatever the epochs
    assert {
        StatusMsg.model_validate_json(broker.retained[f"{PREFIX}/{RUN}/node/{i}/status"]).run
        for i in range(CFG.n)
    } == {f"e{EPOCHS - 1}"}


@pytest.mark.parametrize("channel", ["plain", "sealed"], ids=["plain", "sealed"])
def test_a_node_absent_for_an_epoch_departs_at_zero_and_rejoins(channel: str) -> None:
    cfg = CFG.model_copy(update={"init_channel": channel})
    top = int(np.argmax(values_of(1, CFG.n)))  # the maximum's holder sits epoch 1 out
    broker = MemoryBroker()
    runs = asyncio.run(deployment(cfg, broker, {top: 1}))
    assert [[o.epoch for o in r] for r in runs] == [[0, 1, 2]] * CFG.n  # none overran its period
    assert set(broker.retained) == retained_of(CFG.n, sealed=channel == "sealed")
    assert runs[top][1].result is None
    assert runs[top][1].missed is not None
    present = [i for i in range(CFG.n) if i != top]
    truth = float(values_of(1, CFG.n)[present].max())
    for i in present:
        r = runs[i][1]
        assert output_of(r) == pytest.approx(truth, abs=CFG.tolerance * 10)
        assert r.result is not None
        assert r.result.departed == {top: 0}
    assert output_of(runs[top][2]) == pytest.approx(  # back for the next epoch
        float(values_of(2, CFG.n).max()), abs=1e-3
    )


def test_a_node_whose_every_neighbour_is_absent_misses_the_epoch_rather_than_run_alone() -> None:
    lone, broker = 2, MemoryBroker()
    runs = asyncio.run(deployment(CFG, broker, {i: 1 for i in range(CFG.n) if i != lone}))
    assert runs[lone][1].result is None
    assert "every neighbour absent" in str(runs[lone][1].missed)
    assert [output_of(r[2]) for r in runs] == pytest.approx([float(values_of(2, CFG.n).max())] * CFG.n)


def test_a_stopped_node_leaves_its_epoch_cleanly_and_the_others_go_on() -> None:
    top = int(np.argmax(values_of(1, CFG.n)))
    runs = asyncio.run(deployment(CFG, MemoryBroker(), {}, stopped=(top, 1)))
    assert [o.epoch for o in runs[top]] == [0, 1]  # it left epoch 1 and ran no more
    assert str(runs[top][1].missed).startswith("left at t=")
    for k in (1, 2):
        others = np.delete(values_of(k, CFG.n), top)
        for i in range(CFG.n):
            if i != top:
                assert output_of(runs[i][k]) == pytest.approx(float(others.max()), abs=CFG.tolerance * 10)


def test_a_node_killed_mid_epoch_departs_after_a_period_and_costs_one_epoch() -> None:
    """Its will departs it after a period (not 3/4 of the neighbour timeout, 22.5 s here, which
    outlasts the deployment): the others finish epoch 0 without it, about in time for epoch 1
    (or skip it), and run epoch 2 with it again (the epochs soak found the stall)."""
    top = int(np.argmax(values_of(2, CFG.n)))
    runs = asyncio.run(deployment(CFG, MemoryBroker(), {}, crashed=(top, 0)))
    assert runs[top][0].result is None
    assert [o.epoch for o in runs[top]] == [0, 1, 2]  # restarted: it joins the next start
    for i in range(CFG.n):
        if i != top:
            assert [runs[i][0].epoch, runs[i][-1].epoch] == [0, 2]
            r = runs[i][0].result
            assert r is not None
            assert top in r.departed
    truth = float(values_of(2, CFG.n).max())
    assert [output_of(r[-1]) for r in runs] == pytest.approx([truth] * CFG.n, abs=CFG.tolerance * 10)


@pytest.mark.parametrize(
    ("now", "after", "expected"),
    [(99.0, -1, 0), (100.2, -1, 0), (100.3, -1, 1), (105.0, 0, 1), (113.0, 0, 2), (121.0, 1, 3)],
    ids=["before", "late-within", "too-late", "next", "overran-skips", "past-the-last"],
)
def test_the_clock_joins_on_time_or_the_next_start(now: float, after: int, expected: int) -> None:
    clock = EpochClock(origin=100.0, period=10.0, epochs=3, join=1.0)
    assert clock.next_epoch(now, after) == (expected if expected < 3 else None)


def test_results_file_is_private_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "state" / "results.jsonl"
    records = [
        EpochOutput(node=2, epoch=k, output=20.0 + k, iterations=100, time=1.0e9 + k) for k in range(3)
    ]
    for r in records:
        append_output(path, r)
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_outputs(path) == records
    path.write_text(path.read_text() + "not json\n")
    with pytest.raises(ConfigError, match=r"results\.jsonl:4"):
        read_outputs(path)
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")  # a RecursionError traceback before
    with pytest.raises(ConfigError, match=r"results\.jsonl:1.*recursion limit") as refused:
        read_outputs(path)
    assert "\n" not in str(refused.value)


async def epoch_of_node(
    cfg: RunConfig,
    broker: MemoryBroker,
    i: int,
    epoch: int,
    join_by: float,
    departure_timeout: float | None = None,
    ids: Sequence[Identity] | None = None,
) -> tuple[NodeResult, list[int]]:
    """Node ``i``'s epoch ``epoch`` (its value :func:`values_of`) on ``broker``: result and absent;
    with ``ids``, every node's identity, its messages signed."""
    identity = None if ids is None else ids[i]
    will = node_will(f"{PREFIX}/{RUN}", epoch_run_id(epoch), i, identity, shared=True)
    signing: dict[str, Any] = (
        {} if ids is None else {"identities": [k.public for k in ids], "identity": identity}
    )
    result, _, absent = await run_epoch(
        cfg,
        i,
        float(values_of(epoch, cfg.n)[i]),
        MemoryTransport(broker, f"n{i}", will=will),
        deployment=(PREFIX, RUN),
        epoch=epoch,
        join_by=join_by,
        record=record,
        edges=run_edges(cfg),
        seed=None,
        departure_timeout=departure_timeout,
        **signing,
    )
    return result, absent


async def one_late_node(
    cfg: RunConfig, late: int, broker: MemoryBroker | None = None, ids: Sequence[Identity] | None = None
) -> tuple[list[NodeResult], BaseException | None]:
    """Epoch 0 with node ``late`` connecting after its neighbours' join window closed (on ``broker``,
    signed with ``ids``)."""
    broker = MemoryBroker() if broker is None else broker
    join_by = time.time() + 0.3

    async def node(i: int) -> NodeResult:
        if i == late:
            await asyncio.sleep(0.6)
        result, _ = await epoch_of_node(cfg, broker, i, 0, join_by + (5.0 if i == late else 0.0), ids=ids)
        return result

    out = await asyncio.gather(*(node(i) for i in range(cfg.n)), return_exceptions=True)
    return [r for r in out if isinstance(r, NodeResult)], next(
        (e for e in out if isinstance(e, BaseException)), None
    )


def test_a_node_come_too_late_sits_the_epoch_out() -> None:
    late = int(np.argmax(values_of(0, CFG.n)))
    results, error = asyncio.run(one_late_node(CFG, late))
    assert isinstance(error, DepartedError)
    truth = float(np.delete(values_of(0, CFG.n), late).max())
    assert [r.output[0] for r in results] == pytest.approx([truth] * (CFG.n - 1), abs=CFG.tolerance * 10)


class Recording(MemoryBroker):
    """A broker that keeps every message it routes, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.routed: list[tuple[str, bytes]] = []

    def route(self, topic: str, payload: bytes, retain: bool) -> None:
        self.routed.append((topic, payload))
        super().route(topic, payload, retain)


def test_a_node_counted_departed_says_offline_signed() -> None:
    """In a signed deployment every ``offline`` of a node counted departed verifies with its identity
    (its own, unsigned, was refused by its neighbours, who waited for it until their timeout: the
    flapping deployment of issue 43, break 5, failed its epoch so on a loaded machine)."""
    ids = [new_identity() for _ in range(CFG.n)]
    late, broker = int(np.argmax(values_of(0, CFG.n))), Recording()
    _, error = asyncio.run(one_late_node(CFG, late, broker, ids))
    assert isinstance(error, DepartedError)
    topic = f"{PREFIX}/{RUN}/node/{late}/status"
    offline = [p for t, p in broker.routed if t == topic and json.loads(p)["state"] == "offline"]
    assert offline
    verifier = Verifier([k.public for k in ids])
    assert [signature_error(verifier, topic, late, p, True) for p in offline] == [None] * len(offline)


STALE: dict[str, dict[str, object]] = {
    "leaving": {"state": "leaving", "iterations": 1},
    "offline": {"state": "offline"},
}


class Lingering(MemoryBroker):
    """A broker that routes ``stale`` (topic, payload) again, retained, once the run is at x^(3)
    (a connection of the epoch before lost late: its last will)."""

    def __init__(self, stale: tuple[str, bytes]) -> None:
        super().__init__()
        self.stale: tuple[str, bytes] | None = stale

    def route(self, topic: str, payload: bytes, retain: bool) -> None:
        super().route(topic, payload, retain)
        if self.stale is not None and topic.endswith("/x") and b'"t":3,' in payload:
            stale, self.stale = self.stale, None
            super().route(*stale, True)


async def after_stale(
    cfg: RunConfig, old: int, fields: dict[str, object]
) -> list[tuple[NodeResult, list[int]]]:
    """Epoch 1 of every node with node ``old``'s status (and key) of epoch 0 retained on the shared
    topics, and its status published there again mid-run."""
    shared = f"{PREFIX}/{RUN}/node/{old}"
    status = encode(StatusMsg.model_validate({"node": old, "run": epoch_run_id(0), **fields}))
    key = encode(KeyMsg(node=old, key=base64.b64encode(bytes(range(32))).decode(), run=epoch_run_id(0)))
    broker = Lingering((f"{shared}/status", status))
    broker.route(f"{shared}/status", status, True)
    broker.route(f"{shared}/key", key, True)
    join_by = time.time() + 0.5

    nodes = (epoch_of_node(cfg, broker, i, 1, join_by, departure_timeout=0.05) for i in range(cfg.n))
    return list(await asyncio.gather(*nodes))


@pytest.mark.parametrize("channel", ["plain", "sealed"], ids=["plain", "sealed"])
@pytest.mark.parametrize("state", sorted(STALE), ids=sorted(STALE))
def test_a_status_or_key_of_the_epoch_before_is_stale_in_this_one(state: str, channel: str) -> None:
    """Retained (and sent again mid-run) on the topic every epoch shares, a neighbour's ``leaving``
    or ``offline`` of epoch 0 departs it not in epoch 1, and its key of epoch 0 (sealed) is not its
    key of epoch 1 (each case fails when the router takes them as epoch 1's)."""
    cfg = CFG.model_copy(update={"init_channel": channel})
    top = int(np.argmax(values_of(1, CFG.n)))
    runs = asyncio.run(after_stale(cfg, top, STALE[state]))
    truth = float(values_of(1, CFG.n).max())
    assert [r.output[0] for r, _ in runs] == pytest.approx([truth] * CFG.n, abs=CFG.tolerance * 10)
    assert [(r.departed, absent) for r, absent in runs] == [({}, [])] * CFG.n


@pytest.mark.parametrize(
    ("read", "said"),
    [
        ({}, "warm"),
        ({"read": 24.5, "read_epoch": 6}, "warm from the published 24.5"),
        ({"read": 24.5, "read_epoch": 4}, "warm from the published epoch 4: 24.5"),
    ],
    ids=["own", "epoch-before", "older"],
)
def test_an_epoch_line_says_which_published_output_it_started_from(read: dict[str, float], said: str) -> None:
    report = {"node": 2, "epoch": 7, "output": 25.0, "iterations": 900, "start": "warm", **read}
    assert epoch_line(report) == f"node 2: epoch 7: output 25.0 after 900 iterations, {said}"


@pytest.mark.parametrize(
    ("topic", "payload", "error"),
    [
        ("P/R/results/2", b'{"v":1,"node":2,"epoch":5,"output":1.5,"iterations":9,"time":1.0}', None),
        ("P/R/results/3", b'{"v":1,"node":2,"epoch":5,"output":1.5,"iterations":9,"time":1.0}', "node 2's"),
        ("P/R/results/2", b'{"v":1,"node":2}', "epoch"),
    ],
    ids=["its-own", "another-nodes", "not-a-record"],
)
def test_a_results_topic_holds_its_own_nodes_record_only(
    topic: str, payload: bytes, error: str | None
) -> None:
    if error is None:
        assert published_record(topic, payload).epoch == 5
    else:
        with pytest.raises(ValueError, match=error):
            published_record(topic, payload)


def test_a_results_record_counts_only_signed_by_its_node() -> None:
    ids = [new_identity() for _ in range(3)]
    verifier = Verifier([i.public for i in ids])
    record = EpochOutput(node=2, epoch=5, output=1.5, iterations=9, time=1.0)
    topic = "P/R/results/2"
    assert published_record(topic, sign_record(record, topic, ids[2]), verifier) == record
    assert published_record(topic, sign_record(record, topic, ids[2])) == record  # a reader without keys
    forged = record.model_copy(update={"output": 99.0})
    with pytest.raises(ValueError, match="unsigned message"):
        published_record(topic, forged.encode(), verifier)  # a password holder's (issue 43, break 6)
    with pytest.raises(ValueError, match="does not verify with node 2"):
        published_record(topic, sign_record(forged, topic, ids[0]), verifier)


@pytest.mark.parametrize(
    ("outputs", "fails"),
    [([None, None], True), ([None, 3.0], False), ([], False)],
    ids=["every-epoch-missed", "one-epoch-missed", "none-ran"],
)
async def test_a_node_with_no_output_in_any_epoch_fails_with_error_records(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    outputs: list[float | None],
    fails: bool,
) -> None:
    async def epochs(_start: object, _stop: object) -> AsyncIterator[dict[str, Any]]:
        for k, out in enumerate(outputs):
            report: dict[str, Any] = {"node": 0, "epoch": k, "output": out, "start": "cold"}
            if out is None:
                report.update(missed="session taken over", error=f"epoch {k}: no output")
            yield report

    monkeypatch.setattr(epochnode, "run_node_epochs", epochs)
    start = SimpleNamespace(opts=SimpleNamespace(id=0))
    if fails:  # issue 43, break 5: every node exited 0 with output null
        with pytest.raises(NlaggError, match=r"no output in any of its 2 epoch\(s\) \[0, 1\]"):
            await epochnode.print_epochs(start, as_json=True)  # type: ignore[arg-type]
    else:
        await epochnode.print_epochs(start, as_json=True)  # type: ignore[arg-type]
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [("error" in r) for r in lines] == [o is None for o in outputs]


class Flapping(MemoryBroker):
    """A broker on which node ``node``'s session is taken over ``times`` times once it has published
    x^(3) (:meth:`~nlagg_node.runtime.memory.MemoryBroker.take_over`): each time the broker
    publishes its last will, and the node, back, its status again."""

    def __init__(self, node: int, times: int) -> None:
        super().__init__()
        self.x_topic = f"{PREFIX}/{RUN}/e0/node/{node}/x"
        self.node = node
        self.times, self.sent = times, 0

    def route(self, topic: str, payload: bytes, retain: bool) -> None:
        super().route(topic, payload, retain)
        if topic == self.x_topic:
            self.sent += 1
            if self.sent == 4:
                for _ in range(self.times):
                    self.take_over(f"n{self.node}")  # epoch_of_node's client ids


@pytest.mark.parametrize(
    ("times", "may_depart"),
    [(FLAP_LIMIT - 1, True), (FLAP_LIMIT, True), (FLAP_LIMIT, False)],
    ids=["below-the-limit", "flapping", "flapping-without-may-depart"],
)
def test_a_neighbour_whose_session_flaps_departs_for_the_epoch(times: int, may_depart: bool) -> None:
    """Issue 43, break 5: a session taken over again and again is absence; the others finish (or,
    where the run cannot survive a departure, fail the epoch, named)."""
    cfg = CFG.model_copy(update={"may_depart": may_depart})
    values = values_of(0, cfg.n)
    flapper = int(np.argmax(values))
    broker = Flapping(flapper, times)

    async def epoch() -> list[tuple[NodeResult, list[int]] | BaseException]:
        join_by = time.time() + 0.5
        nodes = (epoch_of_node(cfg, broker, i, 0, join_by) for i in range(cfg.n))
        return list(await asyncio.gather(*nodes, return_exceptions=True))

    runs = asyncio.run(epoch())
    done = {i: run[0] for i, run in enumerate(runs) if isinstance(run, tuple)}
    failed = {i: run for i, run in enumerate(runs) if isinstance(run, BaseException)}
    tol = cfg.tolerance * 10
    if times < FLAP_LIMIT:  # a lost connection or two are waited out
        assert not failed, failed
        assert [r.output[0] for r in done.values()] == pytest.approx([values.max()] * cfg.n, abs=tol)
        assert [r.departed for r in done.values()] == [{}] * cfg.n
        return
    assert isinstance(failed.pop(flapper, None), DepartedError), runs[flapper]
    if may_depart:  # the others finish without it: the max of the rest
        assert not failed, failed
        truth = float(np.delete(values, flapper).max())
        assert [r.output[0] for r in done.values()] == pytest.approx([truth] * (cfg.n - 1), abs=tol)
        assert all(flapper in r.departed for r in done.values())
    else:  # early stopping cannot survive a departure without --may-depart: named, never silent
        assert not done, done
        assert all("needs --may-depart" in str(e) for e in failed.values()), failed
