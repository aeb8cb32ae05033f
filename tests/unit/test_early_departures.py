"""The adversary with early stopping that survives departures (``may_depart``): per-component stops.

A departure that splits the graph lets each connected component stop its phase on its own
(:mod:`nlagg_node.termination`). The simulator's transcript writes each node's x's up to its own
stop with the fields the nodes publish (departures included) and the departure statuses in time
order; the offline attack replays each component up to its own stop, leaving the duals of a stopped
component as they were; the live eavesdropper learns each stop from the x's fields and reaches the
same exposures; the transcript's rules take ``departures`` only where nodes may depart.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from adversary.attack import attack_transcript, score
from adversary.capture.eavesdropper import Eavesdropper
from adversary.live import HIGH, LOW, VALUE, PublicRun, node_ends, replay_exposures
from adversary.simulated import attack_simulation, trial_x, write_sim_transcript
from adversary.transcript import Transcript
from adversary.transcript.arrays import TranscriptData, first_matches, load_transcript_arrays
from nlagg_node.config import RunConfig
from nlagg_node.departure import components
from nlagg_node.protocol import fields_along
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import Node, NodeResult, node_will
from nlagg_node.runtime.public import build_config_msg, run_edges
from nlagg_node.runtime.wire import ConfigMsg, encode, encode_x, topics
from nlagg_node.sim import SimResult, draw_values, simulate
from nlagg_node.termination import NO_STOP, Certificate, Fields, certificate_sign, stop_reach

ARTICULATION = "0,1\n1,2\n2,3\n0,2\n1,3\n3,4\n4,5\n5,6\n6,7\n5,7\n7,8\n6,8\n"  # two 4-cliques through 4
LEFT, MIDDLE, RIGHT = [0, 1, 2, 3], 4, [5, 6, 7, 8]
DEPARTURES = {MIDDLE: 300}
RUN = "early-dep"
TRIALS = 3
T_MAX = 3000  # the top-K network run's cap per phase


def public_run(data: TranscriptData) -> PublicRun:
    """A transcript's arrays (:func:`load_transcript_arrays`) as the replay takes them."""
    return PublicRun(
        data["n"],
        data["edges"],
        data["phases"],
        data["cs"],
        data["theta"],
        data["z0"],
        data["x"],
        data["departed"],
        data["ends"],
    )


def graph_file(folder: Path) -> Path:
    path = folder / "g.csv"
    path.write_text(ARTICULATION)
    return path


def split_config(folder: Path, op: str, **extra: object) -> RunConfig:
    fields: dict[str, object] = {"trials": TRIALS, "record": "all", "seed": 0, **extra}
    return RunConfig(op=op, n=9, graph="file", graph_file=graph_file(folder), may_depart=True, **fields)


_SIMS: dict[str, SimResult] = {}


def split_run(folder: Path, op: str) -> SimResult:
    """The articulation graph split by node 4 leaving at 300 (simulated once per operator)."""
    if op not in _SIMS:
        _SIMS[op] = simulate(split_config(folder, op), departures=DEPARTURES)
    return _SIMS[op]


def x_rows(path: Path) -> list[tuple[int, str, bytes]]:
    """``(id, topic, payload)`` of every stored message, in the order the transcript took them."""
    with sqlite3.connect(path) as db:
        return [
            (int(i), str(tp), bytes(p)) for i, tp, p in db.execute("SELECT id, topic, payload FROM messages")
        ]


OPS = pytest.mark.parametrize("op", ["max", "median"], ids=["max", "median"])


@OPS
def test_the_two_halves_stop_apart_and_the_attack_finds_exactly_the_simulators_events(
    tmp_path: Path, op: str
) -> None:
    sim = split_run(tmp_path, op)
    starts = [0]
    for b in range(TRIALS):
        ran = sim.node_iterations[b, :, 0]
        assert sim.departures_of(b) == DEPARTURES
        assert ran[MIDDLE] == 300  # x^(0) .. x^(299)
        assert (len(set(ran[LEFT].tolist())), len(set(ran[RIGHT].tolist()))) == (
            1,
            1,
        )  # a half stops together
        assert ran[LEFT[0]] != ran[RIGHT[0]]  # ... at its own iteration
        assert sim.phase_iterations[b, 0] == ran.max()
        x = trial_x(sim, b)  # each node's x's up to its own stop, nothing after
        assert np.array_equal(np.isfinite(x), np.arange(x.shape[1])[None, :] < (starts[0] + ran)[:, None])

        db = tmp_path / f"{op}-{b}.sqlite"
        write_sim_transcript(sim, db, trial=b, run_id=RUN)
        with Transcript.open_read_only(db) as tr:
            assert tr.rejected() == []  # one half's x's go on while the other is silent: all valid
        report = attack_transcript(db)
        events = {i: int(t) for i, t in enumerate(sim.first_match[b]) if t >= 0}
        assert events  # something to find
        assert {f.node: f.t for f in report.findings if f.status == "exposed"} == events
        scores = (report.precision, report.recall, report.iteration_agreement, report.interval_soundness)
        assert scores == (1.0, 1.0, 1.0, 1.0)
        assert report.extra["departed"] == {str(MIDDLE): 300}
        assert report.extra["expected_x"] == report.extra["captured_x"] == int(ran.sum())
        assert report.iterations == int(ran.max())
        direct = attack_simulation(sim, b)  # the arrays, without the transcript: the same findings
        assert [(f.node, f.status, f.t) for f in direct.findings] == [
            (f.node, f.status, f.t) for f in report.findings
        ]


@OPS
def test_the_transcript_holds_what_the_nodes_publish_in_time_order(tmp_path: Path, op: str) -> None:
    """Each x with the fields :func:`fields_along` gives (``departures`` included), only up to the
    node's own stop; the departed node's will and its neighbours' statuses before their next x; each
    survivor's ``done`` with its own iterations and final x."""
    sim = split_run(tmp_path, op)
    cfg, b = sim.config, 1
    db = tmp_path / "t.sqlite"
    write_sim_transcript(sim, db, trial=b, run_id=RUN)
    edges = sim.graphs[b]
    ran = sim.node_iterations[b, :, 0]
    reach = stop_reach(cfg.n, edges, True)
    assert reach == cfg.n - 1
    xs = sim.recorded_x[: int(ran.max()), b, :]  # the simulator's own record (its final x after a stop)
    cert = Certificate(sim.protocol_values[b].tolist(), certificate_sign(op)) if cfg.certified else None
    rows = fields_along(
        xs, edges, 0, cfg.stop_window_value, reach, cfg.tolerance, departed=DEPARTURES, certificate=cert
    )
    want = {(i, t): f for t, row in enumerate(rows) for i, f in enumerate(row) if f is not None}
    published = np.bincount([i for i, _ in want], minlength=cfg.n)
    assert published.tolist() == ran.tolist()  # fields_along publishes exactly each node's iterations

    tp = topics("nlagg", RUN)
    got: dict[tuple[int, int], Fields] = {}
    order: dict[tuple[str, int], int] = {}  # (what, node) -> first id
    done: dict[int, dict[str, object]] = {}
    for row_id, topic, payload in x_rows(db):
        doc = json.loads(payload)
        if topic.endswith("/x"):
            i, t = doc["node"], doc["t"]
            deps = tuple(doc.get("departures", ()))
            got[(i, t)] = (doc["quiet"], doc.get("stop", NO_STOP), deps, doc.get("cand"))
            k, e, _, cand = want[(i, t)]
            stop = None if e == NO_STOP else e
            assert payload == encode_x(
                node=i,
                t=t,
                phase=sim.phases[0].name,
                x=float(xs[t, i]),
                quiet=k,
                stop=stop,
                departures=deps or None,
                cand=cand,
            )
            order.setdefault((f"x{t}", i), row_id)
        elif topic.endswith("/status"):
            order.setdefault((doc["state"], doc["node"]), row_id)
            if doc["state"] == "done":
                done[doc["node"]] = doc
    assert got == want
    assert any(f[2] == (300,) for f in got.values())  # the departure travels with the x's
    assert all(f[2] == () for (_, t), f in got.items() if t > 300 + 2 * reach)  # ... and is forgotten
    # The will at 300.5, the neighbours' announcement before their x^(301).
    assert order[("offline", MIDDLE)] < order[("x301", 3)]
    for j in (3, 5):
        assert order[("x300", j)] < order[("running", j)] < order[("x301", j)]
    assert MIDDLE not in done
    for i in LEFT + RIGHT:
        assert done[i]["iterations"] == int(ran[i])
        final = got[i, int(ran[i]) - 1][3] if cfg.certified else None  # a certified stop's candidate
        assert done[i]["final"] == [float(xs[int(ran[i]) - 1, i]) if final is None else final]
        assert done[i].get("departed") == ({"4": 300} if i in (3, 5) else None)
    with Transcript.open_read_only(db) as tr:
        assert tr.statuses()[MIDDLE].state == "offline"
        assert tp.status(MIDDLE) in {topic for topic, _ in tr._payloads("status")}


def live_capture(path: Path, db: Path) -> Eavesdropper:
    """Feed a transcript's messages, in the order it took them, to a fresh eavesdropper."""
    with Transcript(path, run_id=RUN) as tr:
        eaves = Eavesdropper(MemoryTransport(MemoryBroker(), "eve"), tr)
        with sqlite3.connect(db) as src:
            for topic, payload, retained in src.execute(
                "SELECT topic, payload, retained FROM messages ORDER BY id"
            ):
                assert eaves.handle(str(topic), bytes(payload), bool(retained)) is not None
        tr.commit()
        eaves._check_finished()
    return eaves


@OPS
def test_the_live_replay_reaches_the_offline_exposures(tmp_path: Path, op: str) -> None:
    sim = split_run(tmp_path, op)
    for b in range(TRIALS):
        db = tmp_path / f"sim-{b}.sqlite"
        write_sim_transcript(sim, db, trial=b, run_id=RUN)
        eaves = live_capture(tmp_path / f"live-{b}.sqlite", db)
        replay = eaves.replay
        assert replay is not None
        assert eaves.finished.is_set()
        assert (eaves.missing, eaves.rejected) == ((0, 0), 0)
        ran = sim.node_iterations[b, :, 0]
        # Each survivor's stop, learned from its x's fields; the departed node is no stop.
        assert replay.halted == [{i: int(ran[i]) - 1 for i in LEFT + RIGHT}]
        assert replay.departed == DEPARTURES
        assert replay.t_next == ran.max()  # every node stopped: the replay is just past the last x
        assert not replay.advance(force=True)  # ... and steps nothing after it
        assert replay.t_next == ran.max()
        data = load_transcript_arrays(db)
        assert data["ends"] == replay.halted  # the rules' record, read again from the file
        offline = replay_exposures(public_run(data), early_stop=True)
        live = replay.result()
        assert np.array_equal(live.first, offline.first)
        assert np.array_equal(live.first, sim.first_match[b])
        assert np.array_equal(live.branch[:, : offline.branch.shape[1]], offline.branch)
        assert {e.node: e.t for e in eaves.exposures} == {
            i: int(t) for i, t in enumerate(sim.first_match[b]) if t >= 0
        }
        # The half that stopped first kept its duals; stepped with the x's it never published they
        # would be NaN.
        assert replay.duals is not None
        assert np.isfinite(replay.duals).all()
        codes = live.branch[:, : int(ran.max())]
        for i in range(sim.config.n):  # a code exactly at each x the node published
            assert np.array_equal(np.isin(codes[i], [LOW, HIGH, VALUE]), np.arange(codes.shape[1]) < ran[i])


def test_node_ends_are_each_components_and_a_lost_last_x_is_a_gap(tmp_path: Path) -> None:
    sim = split_run(tmp_path, "max")
    x = trial_x(sim, 0)
    edges = sim.graphs[0]
    ran = sim.node_iterations[0, :, 0]
    assert node_ends(sim.phases, x, edges, DEPARTURES).tolist() == [ran.tolist()]
    lost = x.copy()
    lost[0, int(ran[0]) - 1] = np.nan  # the capture lost node 0's last x: its half still ran there
    assert node_ends(sim.phases, lost, edges, DEPARTURES).tolist() == [ran.tolist()]
    assert node_ends(sim.phases, lost)[0, 0] == ran[0] - 1  # its own x's alone end one earlier
    halted = [{0: int(ran[0]) - 1}]  # the rules' record (PhaseEnds.by_phase): it halted with that x
    assert node_ends(sim.phases, lost, known=halted)[0, 0] == ran[0]  # the record's end, not the x's
    assert components(9, edges, DEPARTURES) == [LEFT, RIGHT]


# A multi-phase operator: top-K over the network (the simulator refuses planned departures there), a
# node leaving mid-run; the later phase's exposures need the duals each half kept at its own stop.


async def _network_run(
    cfg: RunConfig, config: ConfigMsg, transcript: Transcript
) -> tuple[list[NodeResult], Eavesdropper]:
    s = draw_values(cfg.values, cfg.seed, 1, cfg.n)[0]
    edges = run_edges(cfg)
    broker = MemoryBroker()
    async with MemoryTransport(broker, "launcher") as launcher:
        await launcher.publish(topics("nlagg", RUN).config, encode(config), retain=True)
    eve = MemoryTransport(broker, "eve")
    await eve.connect()
    eaves = Eavesdropper(eve, transcript, complete_grace=0.5)
    task = asyncio.create_task(eaves.run())
    await eaves.subscribed.wait()

    async def one(i: int) -> NodeResult:
        tr = MemoryTransport(broker, f"node-{i}", will=node_will("nlagg", RUN, i))
        node = Node(
            cfg, i, s[i], tr, run_id=RUN, edges=edges, neighbour_timeout=10.0, departure_timeout=0.05,
            leave_after=DEPARTURES.get(i),
        )  # fmt: skip
        async with node:
            return await node.run()

    results = list(await asyncio.gather(*(one(i) for i in range(cfg.n))))
    async with asyncio.timeout(30):
        await task
    await eve.close()
    return results, eaves


@pytest.mark.parametrize("seed", [1, 3], ids=["seed-1", "seed-3"])
async def test_topk_network_split_live_and_offline_attacks_agree_with_the_truth(
    tmp_path: Path, seed: int
) -> None:
    cfg = RunConfig(
        op="topk", k=2, n=9, graph="file", graph_file=graph_file(tmp_path), may_depart=True, trials=1,
        seed=seed, t_max=T_MAX,
    )  # fmt: skip
    config = build_config_msg(cfg, RUN, run_edges(cfg))
    config = config.model_copy(
        update={"run": {**config.run, "graph_file": "g.csv"}}
    )  # as a deployment names it
    db = tmp_path / "run.sqlite"
    with Transcript(db, run_id=RUN) as transcript:
        results, eaves = await _network_run(cfg, config, transcript)
    replay = eaves.replay
    assert replay is not None
    assert (eaves.missing, eaves.rejected) == ((0, 0), 0)
    assert [r.left_at for r in results if r.node == MIDDLE] == [300]
    # Phase 1: each half stopped at its own iteration; every survivor's own stops, learned live.
    first, second = replay.halted
    assert {first[i] for i in LEFT} != {first[i] for i in RIGHT}
    assert (len({first[i] for i in LEFT}), len({first[i] for i in RIGHT})) == (1, 1)
    assert set(first) == set(second) == set(LEFT + RIGHT)
    assert {r.node: r.iterations for r in results if r.node != MIDDLE} == {
        i: first[i] + 1 + second[i] + 1 - T_MAX for i in LEFT + RIGHT
    }

    data = load_transcript_arrays(db)
    s = draw_values(cfg.values, cfg.seed, 1, cfg.n)[0]
    truth = first_matches(data["x"], s)
    offline = replay_exposures(public_run(data), early_stop=True)
    live = replay.result()
    assert np.array_equal(offline.first, truth)
    assert np.array_equal(live.first, truth)
    early_half = LEFT if first[LEFT[0]] < first[RIGHT[0]] else RIGHT
    # The half that stopped first in phase 1 is exposed in phase 2: its duals were kept at its stop.
    assert any(truth[i] >= T_MAX for i in early_half)
    report = score(attack_transcript(db), s, truth)
    assert (report.precision, report.recall, report.interval_soundness) == (1.0, 1.0, 1.0)


@pytest.mark.parametrize(
    ("early_stop", "may_depart", "why"),
    [
        (False, False, "departures in a run with a fixed schedule"),
        (True, False, "departures in a run whose nodes may not depart"),
        (True, True, None),
    ],
    ids=["fixed-schedule", "early-stop", "may-depart"],
)
def test_an_x_with_departures_is_valid_only_where_nodes_may_depart(
    tmp_path: Path, early_stop: bool, may_depart: bool, why: str | None
) -> None:
    cfg = RunConfig(
        op="max", n=4, graph="ring", t_max=20, trials=1, early_stop=early_stop, may_depart=may_depart
    )
    tp = topics("nlagg", RUN)
    quiet = 0 if early_stop else None
    with Transcript(tmp_path / "t.sqlite", run_id=RUN) as tr:
        tr.add(tp.config, encode(build_config_msg(cfg, RUN, run_edges(cfg))), retained=True)
        for t in range(3):
            for i in range(4):
                assert tr.add(tp.x(i), encode_x(node=i, t=t, phase="max", x=1.0 - t, quiet=quiet)) is not None
        stored = tr.add(tp.x(1), encode_x(node=1, t=3, phase="max", x=0.5, quiet=quiet, departures=(2,)))
        assert (stored is not None) == (why is None)
        if why is not None:
            [(topic, error)] = tr.rejected()
            assert topic == tp.x(1)
            assert why in error
            assert np.isnan(tr.x(4, 20)[1, 3])
        else:
            assert tr.rejected() == []
            assert tr.x(4, 20)[1, 3] == 0.5


@pytest.mark.parametrize("may_depart", [False, True], ids=["diameter", "may-depart"])
def test_an_x_after_its_nodes_stop_is_refused(tmp_path: Path, may_depart: bool) -> None:
    """A node's x that says it ends the phase (stop == t) is its last of the phase: a later one (a
    forger's) is stored invalid, so it cannot stretch the node's phase in the offline attack. The
    stop is the earliest one the run allows (W = 1: 2D, D the reach)."""
    cfg = RunConfig(op="max", n=4, graph="ring", t_max=20, trials=1, may_depart=may_depart, stop_window=1)
    stop = 6 if may_depart else 4  # 2 (n - 1), or twice the ring's diameter
    tp = topics("nlagg", RUN)
    with Transcript(tmp_path / "t.sqlite", run_id=RUN) as tr:
        tr.add(tp.config, encode(build_config_msg(cfg, RUN, run_edges(cfg))), retained=True)
        for t in range(stop + 1):
            for i in range(4):
                assert (
                    tr.add(tp.x(i), encode_x(node=i, t=t, phase="max", x=1.0 - t, quiet=0, stop=stop))
                    is not None
                )
        assert tr.add(tp.x(1), encode_x(node=1, t=stop + 1, phase="max", x=0.5, quiet=0, stop=stop)) is None
        [(topic, error)] = tr.rejected()
        assert topic == tp.x(1)
        assert f"node 1 ended this phase after t={stop}" in error
        assert np.isnan(tr.x(4, 20)[1, stop + 1])


@pytest.mark.parametrize("before", ["announced", "all"], ids=["up-to-the-departure", "everything"])
def test_what_came_before_the_config_is_caught_up_on_departures_and_stops_included(
    tmp_path: Path, before: str
) -> None:
    """Messages before the configuration are caught up on when it comes: the departure its
    neighbours announced, and the stops the x's fields tell."""
    sim = split_run(tmp_path, "max")
    db = tmp_path / "sim.sqlite"
    write_sim_transcript(sim, db, trial=0, run_id=RUN)
    rows = [(tp, p) for _, tp, p in x_rows(db)]
    config = [r for r in rows if r[0].endswith("/config")]
    rest = [r for r in rows if not r[0].endswith("/config")]
    # Both neighbours' announcements (and the will) come before any x^(301).
    split = len(rest) if before == "all" else next(k for k, (_, p) in enumerate(rest) if b'"t":301,' in p)
    assert sum(b'"departed"' in p for _, p in rest[:split]) >= 2
    with Transcript(tmp_path / "late.sqlite", run_id=RUN) as tr:
        eaves = Eavesdropper(MemoryTransport(MemoryBroker(), "eve"), tr)
        for topic, payload in rest[:split] + config + rest[split:]:
            assert eaves.handle(topic, payload, topic.endswith("/status")) is not None
        tr.commit()
        eaves._check_finished()
        replay = eaves.replay
        assert replay is not None
        assert replay.departed == DEPARTURES
        assert eaves.finished.is_set()
        ran = sim.node_iterations[0, :, 0]
        assert replay.halted == [{i: int(ran[i]) - 1 for i in LEFT + RIGHT}]
        assert np.array_equal(replay.result().first, sim.first_match[0])


def test_a_restarted_eavesdropper_knows_the_stops_its_transcript_holds(tmp_path: Path) -> None:
    """An eavesdropper that continues its transcript after a restart learns the stops stored
    before it (the rules' record, which its replay reads) once the retained configuration comes
    again, and reaches the simulator's exposures."""
    sim = simulate(split_config(tmp_path, "max", trials=1))  # no departure: every node stops at once
    db = tmp_path / "sim.sqlite"
    write_sim_transcript(sim, db, trial=0, run_id=RUN)
    rows = [(tp, p) for _, tp, p in x_rows(db)]
    config = [r for r in rows if r[0].endswith("/config")]
    last = int(sim.node_iterations[0, 0, 0]) - 1  # every node's last x, which says it stops
    assert last < sim.phases[0].t_len - 1
    split = 1 + max(k for k, (_, p) in enumerate(rows) if f'"t":{last},'.encode() in p)
    path = tmp_path / "live.sqlite"
    for part in (rows[:split], config + rows[split:]):  # stopped, restarted: the rest
        with Transcript(path, run_id=RUN) as tr:
            eaves = Eavesdropper(MemoryTransport(MemoryBroker(), "eve"), tr)
            for topic, payload in part:
                assert eaves.handle(topic, payload, topic.endswith(("/status", "/config"))) is not None
            tr.commit()
            eaves._check_finished()
    replay = eaves.replay
    assert replay is not None
    assert (eaves.rejected, eaves.finished.is_set()) == (0, True)
    assert replay.halted == [dict.fromkeys(range(9), last)]
    assert np.array_equal(replay.result().first, sim.first_match[0])
