"""Departures (nlagg_node.departure): the survivors end with their own aggregate, as the simulator."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from adversary.attack import attack_transcript
from nlagg_node.cli import main
from nlagg_node.config import RunConfig
from nlagg_node.departure import components, kept_edges, parse_departures
from nlagg_node.errors import ConfigError, DepartedError, StopRequested
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import Node, NodeResult, node_will, run_edges
from nlagg_node.runtime.wire import StatusMsg, encode, topics
from nlagg_node.sim import draw_values, simulate
from nlagg_node.sim.output import summarize
from tests.harness.departures import RUN, run_with_departures

SLOW = pytest.mark.slow


ARTICULATION = "0,1\n1,2\n2,3\n0,2\n1,3\n3,4\n4,5\n5,6\n6,7\n5,7\n7,8\n6,8\n"  # two 4-cliques through 4


@pytest.mark.parametrize(
    ("op", "graph", "t_max", "departures", "killed", "early"),
    [
        ("max", "rgg", 200, {"top": 60}, False, False),
        pytest.param("max", "rgg", 1500, {"top": 60}, True, False, marks=SLOW),
        ("median", "rgg", 600, {1: 40, 5: 90}, True, False),
        ("topk", "rgg", 100, {"top": 30}, False, False),
        pytest.param("max", "ring", 1500, {0: 50, 4: 80}, True, False, marks=SLOW),
        ("max", "rgg", 4000, {"top": 300}, True, True),
        ("median", "rgg", 3000, {1: 40, 5: 400}, False, True),
        ("max", "articulation", 3000, {4: 300}, True, True),
        ("max", "rgg", 4000, {"top": 3990}, True, True),
        ("median", "star", 200, {0: 50}, True, False),
        ("median", "star", 3000, {0: 100}, True, True),
    ],
    ids=[
        "max-leaving",
        "max-killed",
        "median-two-killed",
        "topk-leaving",
        "ring-split",
        "early-max-killed",
        "early-median-two-leaving",
        "early-split-stops-apart",
        "early-departure-after-the-stop",
        "every-survivor-alone",
        "early-every-survivor-alone",
    ],
)
async def test_survivors_equal_the_simulator_bit_for_bit(
    op: str,
    graph: str,
    t_max: int,
    departures: dict[int | str, int],
    killed: bool,
    early: bool,
    tmp_path: Path,
) -> None:
    """With early stopping (``may_depart``) too: every node runs the simulator's iterations, its
    component's stop included; a departure planned after the stop does not happen (the node finished)."""
    graph_file = None
    if graph == "articulation":
        graph_file = tmp_path / "g.csv"
        graph_file.write_text(ARTICULATION)
        graph = "file"
    cfg = RunConfig(
        early_stop=early, may_depart=early, op=op, n=9 if graph_file else 8, graph=graph,
        graph_file=graph_file, trials=1, record="all", t_max=t_max, seed=5,
    )  # fmt: skip
    top = int(np.argmax(simulate(cfg).values[0]))
    dep = {top if j == "top" else int(j): t for j, t in departures.items()}
    sim = simulate(cfg, departures=dep)
    results = await run_with_departures(cfg, dep, killed=killed)
    happened = sim.departures_of(0)
    here = [r for r in results if r.node not in happened]
    assert [r.left_at for r in results if r.node in happened] == list(happened.values())
    ran = sim.node_iterations[0].sum(axis=1)
    for r in here:
        assert r.iterations == ran[r.node]
        assert np.array_equal(r.x, sim.recorded_x[: ran[r.node], 0, r.node])
        assert np.array_equal(np.ravel(r.output), np.ravel(sim.output[0, r.node]))
        nbrs = {j for a, b in run_edges(cfg).tolist() for j in (a, b) if r.node in (a, b)} - {r.node}
        assert r.departed == {j: t for j, t in happened.items() if j in nbrs}
    comps = components(cfg.n, run_edges(cfg), happened)
    for comp in comps:  # every survivor ends with its own component's aggregate
        outs = np.array([np.ravel(results[i].output) for i in comp])
        assert np.allclose(outs, outs[0], rtol=0, atol=cfg.tolerance)
        assert len({int(ran[i]) for i in comp}) == 1  # a component stops together
    if op == "max" and t_max > 1000 and max(dep.values()) < 1000:  # the departed maximum is gone
        for comp in comps:
            assert np.allclose(sim.output[0, comp], sim.values[0, comp].max(), rtol=0, atol=cfg.tolerance)
    if graph_file is not None:  # the departure split the graph: its two halves stopped apart
        assert ran[0] != ran[5]
    if departures.get("top") == 3990:
        assert happened == {}  # the run had stopped: the node finished instead


async def test_a_departure_just_before_the_stop_voids_it_for_every_node_alike() -> None:
    """A departure inside ``[e - 2D, e - D]`` of the stop ``e`` (D = n - 1) may have escaped the
    counters behind it: every node voids that stop and goes on, the simulator and the nodes alike."""
    cfg = RunConfig(
        early_stop=True, may_depart=True, op="max", n=8, trials=1, record="all", t_max=4000, seed=5
    )
    plain = simulate(cfg)
    e = int(plain.phase_iterations[0, 0]) - 1  # where the run stops without the departure
    low = int(np.argmin(plain.values[0]))
    dep = {low: e - cfg.n}  # in [e - 2D, e - D]: the proposal behind e came just after it
    sim = simulate(cfg, departures=dep)
    assert sim.departures_of(0) == dep
    assert int(sim.phase_iterations[0, 0]) - 1 > e  # voided: the survivors went on
    results = await run_with_departures(cfg, dep, killed=True)
    ran = sim.node_iterations[0].sum(axis=1)
    for r in results:
        if r.node != low:
            assert r.iterations == ran[r.node]
            assert np.array_equal(r.x, sim.recorded_x[: ran[r.node], 0, r.node])


REFUSED = r"^node 2: neighbour \d+ counts this node as departed at t=40; .*refused for the rest of the run"


async def test_a_departed_node_that_comes_back_is_refused_for_the_run() -> None:
    """Issue 16: node 2, killed at t=40, restarts on the same broker after the survivors finished; its
    neighbours' retained statuses count it as departed, so it is refused (DepartedError) with a
    message naming the node and the iteration it left at, and publishes no x."""
    cfg = RunConfig(early_stop=False, op="max", n=8, graph="rgg", trials=1, record="all", t_max=200, seed=5)
    broker = MemoryBroker()
    results = await run_with_departures(cfg, {2: 40}, killed=True, broker=broker)
    assert results[2].left_at == 40
    assert all(2 in r.departed for r in results if 2 in neighbours_of(run_edges(cfg), r.node))
    s = draw_values(cfg.values, cfg.seed, 1, cfg.n)[0]
    async with MemoryTransport(broker, "watch") as watch:
        await watch.subscribe(topics("nlagg", RUN).x(2))
        back = MemoryTransport(broker, "node-2-again", will=node_will("nlagg", RUN, 2))
        node = Node(cfg, 2, s[2], back, run_id=RUN, edges=run_edges(cfg), neighbour_timeout=5.0)
        async with node:
            with pytest.raises(DepartedError, match=REFUSED):
                await asyncio.wait_for(node.run(), timeout=10.0)
        with pytest.raises(TimeoutError):  # not one x of the refused node reached the broker
            await asyncio.wait_for(anext(aiter(watch.messages())), timeout=0.2)


class Liar(MemoryBroker):
    """A broker on which node ``liar``'s status claims, once node ``victim`` has published x^(t),
    that ``victim`` departed at t, while ``victim`` is connected throughout (issue 43: one insider's
    word)."""

    def __init__(self, liar: int, victim: int, t: int) -> None:
        super().__init__()
        self.victim_x = topics("nlagg", RUN).x(victim)
        self.claim = (
            topics("nlagg", RUN).status(liar),
            StatusMsg(node=liar, state="running", departed={str(victim): t}),
        )
        self.t, self.seen = t, 0

    def route(self, topic: str, payload: bytes, retain: bool) -> None:
        super().route(topic, payload, retain)
        if topic == self.victim_x:
            self.seen += 1
            if self.seen == self.t + 1:
                super().route(self.claim[0], encode(self.claim[1]), True)


async def test_a_claim_that_a_live_node_departed_is_refused_by_it(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 43: node 0's status says its neighbour 1 departed at t=20 while node 1 has published
    every x from its first on one connection: node 1 refuses the claim, named, instead of stopping
    (DepartedError), and every node ends as the simulator's run without a departure, bit for bit."""
    cfg = RunConfig(early_stop=False, op="max", n=6, graph="ring", trials=1, record="all", t_max=200, seed=5)
    sim = simulate(cfg)
    results = await run_with_departures(cfg, {}, killed=False, broker=Liar(0, 1, 20))
    for r in results:
        assert np.array_equal(r.x, sim.recorded_x[:, 0, r.node])
        assert r.departed == {}
    assert (
        "status of node 0: claims node 1 departed at t=20, but node 1 has been connected throughout"
        in caplog.text
    )


def test_ring_split_reports_two_components_with_their_own_results() -> None:
    cfg = RunConfig(early_stop=False, op="max", n=8, graph="ring", trials=1, seed=3)
    sim = simulate(cfg, departures={0: 100, 4: 150})
    assert sim.components == [[[1, 2, 3], [5, 6, 7]]]
    s = sim.values[0]
    assert np.allclose(sim.output[0, [1, 2, 3]], s[[1, 2, 3]].max(), rtol=0, atol=1e-12)
    assert np.allclose(sim.output[0, [5, 6, 7]], s[[5, 6, 7]].max(), rtol=0, atol=1e-12)
    assert np.isnan(sim.output[0, [0, 4]]).all()


@pytest.mark.parametrize(
    ("spec", "why"),
    [("3", "node@iteration"), ("3@10,3@20", "twice"), ("x@1", "node@iteration")],
    ids=["no-at", "twice", "not-a-number"],
)
def test_bad_departure_specs_name_the_part(spec: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_departures(spec)


@pytest.mark.parametrize(
    ("cfg", "dep", "why"),
    [
        (RunConfig(early_stop=False, op="max", n=6, trials=1, t_max=100), {9: 10}, "0..5"),
        (RunConfig(early_stop=False, op="max", n=6, trials=1, t_max=100), {1: 100}, "1..99"),
        (RunConfig(op="max", n=6, trials=1, t_max=100, early_stop=True), {1: 10}, "no-early-stop"),
        (RunConfig(early_stop=False, op="trimmed-mean", n=6, trials=1, k=1), {1: 10}, "every node"),
        (RunConfig(early_stop=False, op="topk", n=6, graph="ring", trials=1, k=3), {0: 10, 3: 10}, "too few"),
    ],
    ids=["unknown-node", "too-late", "early-stop", "trimmed-mean", "topk-too-few"],
)
def test_impossible_departures_are_refused(cfg: RunConfig, dep: dict[int, int], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        simulate(cfg, departures=dep)


def test_an_edge_goes_with_either_end() -> None:
    lo, hi = np.array([0, 0, 1, 2]), np.array([1, 2, 2, 3])
    assert kept_edges(lo, hi, [2]).tolist() == [True, False, False, False]


def test_sim_cli_departure_and_its_transcript_attacked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``nlagg sim --depart``: the survivors' outputs, who left; its transcript holds the departure as a
    network does (the will, then the neighbours' statuses) and the attack replays it: the exposures are
    the simulator's matching events."""
    db = tmp_path / "run.sqlite"
    args = ["sim", "--op", "max", "--n", "8", "--trials", "1", "--t-max", "1000", "--c", "10", "--mu-z", "30"]
    monkeypatch.setattr("sys.argv", ["nlagg", *args, "--depart", "2@100", "--transcript", str(db), "--json"])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code in (0, None)
    summary = json.loads(capsys.readouterr().out)
    cfg = RunConfig(op="max", n=8, trials=1, t_max=1000, c=10.0, mu_z=30.0, record="all", may_depart=True)
    sim = simulate(cfg, departures={2: 100})
    assert summary["departed"] == {"2": 100}
    assert summary["survivors"] == [0, 1, 3, 4, 5, 6, 7]
    assert summary["final_x"]["2"] is None
    assert [summary["final_x"][str(i)] for i in summary["survivors"]] == sim.output[
        0, summary["survivors"]
    ].tolist()
    report = attack_transcript(db)
    assert report.extra["departed"] == {"2": 100}
    exposed = {f.node: f.t for f in report.findings if f.status == "exposed"}
    assert exposed == {i: int(t) for i, t in enumerate(sim.first_match[0]) if t >= 0}
    assert np.isnan(sim.recorded_x[100:, 0, 2]).all()  # x_2^(100) on is never published


async def test_a_node_told_to_leave_mid_run_says_leaving_and_the_rest_match_the_simulator() -> None:
    """What SIGTERM does to ``nlagg node`` (``Node.leave``): it leaves before its next x with a clean
    ``leaving``; the survivors drop it at the iteration it names, bit for bit the simulator's run."""
    cfg = RunConfig(early_stop=False, op="median", n=8, trials=1, record="all", t_max=400, seed=5)
    s = draw_values(cfg.values, cfg.seed, 1, cfg.n)[0]
    edges = run_edges(cfg)
    broker = MemoryBroker()
    nodes = [
        Node(cfg, i, s[i], MemoryTransport(broker, f"node-{i}", will=node_will("nlagg", RUN, i)), run_id=RUN,
             edges=edges, neighbour_timeout=10.0)
        for i in range(cfg.n)
    ]  # fmt: skip

    async def one(node: Node) -> NodeResult:
        async with node:
            return await node.run()

    async def stop_later() -> None:  # once node 3 has published x^(50)
        async with MemoryTransport(broker, "watch") as watch:
            await watch.subscribe(topics("nlagg", RUN).x(3))
            async for msg in watch.messages():
                if b'"t":50,' in msg.payload:
                    break
        nodes[3].leave()

    results, _ = await asyncio.gather(asyncio.gather(*(one(nd) for nd in nodes)), stop_later())
    t_left = results[3].left_at
    assert t_left is not None
    assert 0 < t_left < 400
    sim = simulate(cfg, departures={3: t_left})
    here = [r for r in results if r.node != 3]
    assert np.array_equal(np.array([r.x for r in here]).T, sim.recorded_x[:, 0, [r.node for r in here]])
    assert all(r.departed.get(3) == t_left for r in here if 3 in neighbours_of(edges, r.node))


async def test_a_node_told_to_leave_before_its_first_x_stops_at_once() -> None:
    """A SIGTERM while the node waits for neighbours that never come online (their launcher was
    killed): it has published no x, so there is nothing to leave; it stops at once with
    StopRequested instead of waiting out its startup timeout."""
    cfg = RunConfig(early_stop=False, op="max", n=4, trials=1, t_max=50, seed=5)
    edges = run_edges(cfg)
    node = Node(cfg, 0, 1.0, MemoryTransport(MemoryBroker(), "node-0"), run_id=RUN, edges=edges,
                startup_timeout=600.0)  # fmt: skip
    assert node.leave() is False  # nothing published yet: nothing to leave
    stop = asyncio.Event()
    async with node:
        running = asyncio.ensure_future(node.run(stop))
        await asyncio.sleep(0.05)  # announcing, waiting for its neighbours
        assert not running.done()
        stop.set()
        async with asyncio.timeout(5):
            with pytest.raises(StopRequested, match="nothing to leave"):
                await running


def neighbours_of(edges: np.ndarray, i: int) -> set[int]:
    return {int(b if a == i else a) for a, b in edges.tolist() if i in (a, b)}


def test_a_departure_planned_after_the_stop_is_reported_as_not_happened() -> None:
    """Early stopping: node 4 planned to leave at 1500, but most median trials stop before. One
    trial's summary says who left in it; several trials', the share of trials each one left in."""
    cfg = RunConfig(op="median", n=15, trials=200, seed=0, record="none", may_depart=True)
    many = summarize(simulate(cfg, departures={4: 1500}))
    assert 0.1 < many["departed_fraction"]["4"] < 0.9
    one = simulate(cfg.model_copy(update={"trials": 1}), departures={4: 1500})
    assert one.departures_of(0) == {}  # trial 0 stops before t = 1500
    summary = summarize(one)
    assert summary["departed"] == {}
    assert 4 in summary["survivors"]
    assert summary["final_x"]["4"] is not None
