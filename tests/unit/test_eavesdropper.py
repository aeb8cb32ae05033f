"""Transcript storage, the live replay of the z-recursion, and the eavesdropper over memory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import msgspec
import numpy as np
import pytest

from adversary.capture.eavesdropper import Eavesdropper
from adversary.live import LiveReplay, PublicRun, replay_exposures
from adversary.simulated import simulate_transcript, trial_x
from adversary.transcript import Transcript
from nlagg_node.config import RunConfig
from nlagg_node.runtime.hosted import host_nodes
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import Node
from nlagg_node.runtime.public import build_config_msg, run_edges
from nlagg_node.runtime.transport import Message
from nlagg_node.runtime.wire import AdvStateMsg, StatusMsg, XMsg, encode, split_x_batch, topics
from nlagg_node.schedule import phase_c, plan_phases
from nlagg_node.sim import draw_values, simulate


@pytest.mark.parametrize("early_stop", [True, False], ids=["early-stop", "fixed-schedule"])
@pytest.mark.parametrize("op", ["max", "median", "topk"], ids=["max", "median", "topk"])
def test_replay_finds_exactly_the_simulators_matching_events(op: str, early_stop: bool) -> None:
    # With early stopping the x's end where each phase stopped (NaN after), and the replay skips
    # to the next phase there, as the nodes do: top-K's later phases go on from those duals.
    cfg = RunConfig(op=op, n=12, trials=1, record="all", seed=4, t_max=2500, early_stop=early_stop)
    sim = simulate(cfg.resolved())
    phases = plan_phases(cfg)
    x = trial_x(sim, 0)
    assert np.isnan(x).any() == early_stop
    cs = [phase_c(cfg, p) for p in phases]
    run = PublicRun(cfg.n, run_edges(cfg), phases, cs, cfg.theta, sim.z0, x)
    ex = replay_exposures(run, early_stop=early_stop)
    assert np.array_equal(ex.first, sim.first_match[0])
    exposed = ex.first >= 0
    assert np.array_equal(ex.value[exposed], sim.values[0][exposed])
    ran = ~np.isnan(x).all(axis=0)
    assert (ex.branch[:, ran] >= 0).all()  # every iteration run is classified
    assert (ex.branch[:, ~ran] == -1).all()  # and none of those skipped


def test_replay_marks_missing_data_unknown() -> None:
    cfg = RunConfig(op="median", n=8, trials=1, record="all", seed=2, t_max=50).resolved()
    sim = simulate(cfg)
    x = sim.recorded_x[:, 0, :].T.copy()
    x[3, 10] = np.nan
    phases = plan_phases(cfg)
    ex = replay_exposures(PublicRun(cfg.n, run_edges(cfg), phases, [cfg.c_value], cfg.theta, sim.z0, x))
    assert ex.branch[3, 10] == -1
    assert (ex.branch[:, :10] >= 0).all()


def test_live_replay_says_which_x_completes_its_iteration() -> None:
    # The eavesdropper advances the replay only on the x that completes an iteration: the last of
    # n, or of the survivors once a node has departed. Repeats and x's outside the run complete nothing.
    cfg = RunConfig(op="max", n=3, t_max=4, graph="ring")
    phases = plan_phases(cfg)
    replay = LiveReplay(3, run_edges(cfg), phases, [phase_c(cfg, p) for p in phases], cfg.theta)
    assert [replay.add_x(i, 0, 0.5) for i in (2, 0)] == [False, False]
    assert replay.add_x(0, 0, 0.7) is False  # a second x_0^(0): the first one is kept
    assert replay.add_x(1, 0, 0.5) is True
    assert replay.x[0, 0] == 0.5
    assert replay.add_x(3, 1, 0.5) is False  # no node 3
    assert replay.add_x(0, 4, 0.5) is False  # no iteration 4
    replay.depart(2, 2)
    assert [replay.add_x(i, 1, 0.5) for i in (0, 1, 2)] == [False, False, True]
    assert [replay.add_x(i, 2, 0.5) for i in (1, 0)] == [False, True]  # node 2 is gone from t = 2


def test_a_late_z0_advances_the_live_replay_at_once(tmp_path: Path) -> None:
    # Over bridged brokers every x of an iteration may come before a z^(0) of its group: the
    # replay then waits, and the z^(0) that completes the group moves it on without another x.
    cfg = RunConfig(op="max", n=5, t_max=20, seed=1, early_stop=False)
    src = simulate_transcript(cfg, tmp_path / "src.sqlite", run_id="late")
    sql = "SELECT topic, payload FROM messages ORDER BY id"  # in capture order
    with Transcript.open_read_only(src) as tr:
        rows = [(str(t), bytes(p)) for t, p in tr.db.execute(sql)]
    x0 = [r for r in rows if r[0].endswith("/x") and b'"t":0,' in r[1]]
    z0 = [r for r in rows if r[0].endswith("/z0")]
    assert len(x0) == cfg.n
    assert z0
    first = [r for r in rows if r[0].endswith("/config")]
    with Transcript(tmp_path / "t.sqlite", run_id="late") as transcript:
        eaves = Eavesdropper(MemoryTransport(MemoryBroker(), "eve"), transcript)
        for topic, payload in first + x0 + z0[:-1]:
            assert eaves.handle(topic, payload) is not None
        assert eaves.replay is not None
        assert eaves.replay.t_next == 0  # every x^(0), but one z^(0) missing
        eaves.handle(*z0[-1])
        assert eaves.replay.t_next == 1


def test_transcript_keeps_a_duplicate_once_and_rejects_junk(tmp_path: Path) -> None:
    t = topics("nlagg", "r1")
    payload = encode(XMsg(node=1, t=0, phase="max", x=0.5))
    with Transcript(tmp_path / "t.sqlite", run_id="r1") as tr:
        assert tr.add(t.x(1), payload) is not None
        tr.add(t.x(1), payload)
        assert tr.add(t.x(1), b"garbage") is None
        tr.commit()
        assert tr.count() == 2
        assert tr.count(valid_only=True) == 1
        assert tr.rejected()[0][0] == t.x(1)
        x = tr.x(3)
    assert x.shape == (3, 1)
    assert x[1, 0] == 0.5
    assert np.isnan(x[0, 0])


def test_transcript_refuses_another_run(tmp_path: Path) -> None:
    Transcript(tmp_path / "t.sqlite", run_id="r1").close()
    with pytest.raises(ValueError, match="run_id='r2'"):
        Transcript(tmp_path / "t.sqlite", run_id="r2")


async def test_eavesdropper_captures_a_run_and_stops_when_all_done(tmp_path: Path) -> None:
    cfg = RunConfig(op="median", n=7, trials=1, t_max=300, seed=6, record="all")
    sim = simulate(cfg)
    broker = MemoryBroker()
    edges = run_edges(cfg)
    t = topics("nlagg", "cap")
    found: list[int] = []
    with Transcript(tmp_path / "t.sqlite", run_id="cap") as transcript:
        async with MemoryTransport(broker, "launcher") as launcher:
            await launcher.publish(t.config, encode(build_config_msg(cfg, "cap", edges)), retain=True)
        eve_tr = MemoryTransport(broker, "eve")
        await eve_tr.connect()
        eaves = Eavesdropper(eve_tr, transcript, on_exposure=lambda e: found.append(e.node))
        task = asyncio.create_task(eaves.run())
        await eaves.subscribed.wait()
        s = draw_values(cfg.values, cfg.seed, 1, cfg.n)[0]
        async with MemoryTransport(broker, "host") as tr:
            nodes = [
                Node(cfg, i, s[i], tr, run_id="cap", edges=edges, own_transport=False) for i in range(cfg.n)
            ]
            await host_nodes(nodes, tr, "nlagg", "cap")
        async with asyncio.timeout(10):
            await task
        assert eaves.finished.is_set()
        x = transcript.x(cfg.n)
    assert np.array_equal(x, sim.recorded_x[:, 0, :].T)
    expected = sorted(int(i) for i in np.flatnonzero(sim.first_match[0] >= 0))
    assert sorted(found) == expected
    assert eaves.honest_exposed() == expected


def x_iteration(msg: Message) -> int:
    """The iteration of an x, alone or in a host's batch (of one iteration); -1 for anything else."""
    batch = split_x_batch(msg.topic, msg.payload, "nlagg", "cr")
    if batch is not None:
        return batch[0][0].msg.t
    return msgspec.json.decode(msg.payload, type=XMsg).t if msg.topic.endswith("/x") else -1


class CrashedBrokerCapture(MemoryTransport):
    """A capture client whose broker crashed while x's of iterations ``lost_from..`` were queued
    for it: they never come, and (with ``session_lost``) it came back without its session."""

    def __init__(self, broker: MemoryBroker, lost_from: int, session_lost: bool) -> None:
        super().__init__(broker, "eve")
        self.lost_from, self.session_lost = lost_from, session_lost
        self.lost: list[Message] = []
        self.back = False  # the broker is back: what the nodes republish arrives

    async def messages(self) -> AsyncIterator[Message]:
        async for msg in super().messages():
            if not self.back and x_iteration(msg) >= self.lost_from:
                self.lost.append(msg)
                continue
            yield msg

    def ack(self, deliveries: Iterable[Message]) -> None:
        pass

    def backlog(self) -> int:
        return 0

    def lost_sessions(self) -> int:
        return int(self.session_lost and bool(self.lost))


@pytest.mark.parametrize("session_lost", [True, False], ids=["session-lost", "session-kept"])
async def test_a_capture_that_lost_its_session_waits_for_the_nodes_republish(
    tmp_path: Path, session_lost: bool
) -> None:
    """After a broker crash the nodes publish their x's again up to 15 s later (RESEND_AFTER): a
    capture that lost its session waits for that past ``complete_grace``; otherwise it gives up
    after the grace and reports what is missing (a 10 s grace lost the last resend, CI)."""
    cfg = RunConfig(op="max", n=4, graph="ring", trials=1, t_max=30, seed=2, early_stop=False, record="all")
    sim = simulate(cfg)
    broker, edges = MemoryBroker(), run_edges(cfg)
    with Transcript(tmp_path / "t.sqlite", run_id="cr") as transcript:
        eve_tr = CrashedBrokerCapture(broker, lost_from=20, session_lost=session_lost)
        await eve_tr.connect()
        config = build_config_msg(cfg, "cr", edges)
        eaves = Eavesdropper(eve_tr, transcript, config=config, complete_grace=0.3)
        task = asyncio.create_task(eaves.run())
        await eaves.subscribed.wait()
        s = draw_values(cfg.values, cfg.seed, 1, cfg.n)[0]
        async with MemoryTransport(broker, "host") as tr:
            nodes = [Node(cfg, i, s[i], tr, run_id="cr", edges=edges, own_transport=False) for i in range(4)]
            await host_nodes(nodes, tr, "nlagg", "cr")
        if session_lost:
            await asyncio.sleep(1.5)  # five graces: still waiting for the nodes' republish
            assert not task.done()
            eve_tr.back = True
            async with MemoryTransport(broker, "host") as tr:
                for msg in eve_tr.lost:
                    await tr.publish(msg.topic, msg.payload)
        async with asyncio.timeout(10):
            await task
        assert eaves.missing == ((0, 0) if session_lost else (4 * 10, 0))
        x = transcript.x(cfg.n, 30)
    assert np.array_equal(x[:, :20], sim.recorded_x[:20, 0, :].T)
    assert bool(np.isnan(x[:, 20:]).all()) is not session_lost


@pytest.mark.parametrize("reorder", [False, True], ids=["one-ordered-broker", "broker-cluster"])
async def test_an_x_that_overtook_its_predecessors_waits_for_them_only_on_a_cluster(
    tmp_path: Path, reorder: bool
) -> None:
    # One Mosquitto forwards x_1^(1) after the x^(0)'s it was computed from, so an x ahead of them
    # is out of every window for good; a cluster's members may deliver it first (seen on RabbitMQ).
    cfg = RunConfig(op="max", n=3, graph="ring", trials=1, t_max=5, seed=1, early_stop=False).resolved()
    phase = plan_phases(cfg)[0].name
    t = topics("nlagg", "cl")
    broker = MemoryBroker()
    with Transcript(tmp_path / "t.sqlite", run_id="cl") as transcript:
        eve_tr = MemoryTransport(broker, "eve")
        await eve_tr.connect()
        config = build_config_msg(cfg, "cl", run_edges(cfg))
        eaves = Eavesdropper(eve_tr, transcript, config=config, reorder=reorder, reorder_grace=30.0)
        task = asyncio.create_task(eaves.run())
        await eaves.subscribed.wait()
        async with MemoryTransport(broker, "nodes") as tr:
            for i, step in [(1, 1), (0, 0), (1, 0), (2, 0)]:
                await tr.publish(t.x(i), encode(XMsg(node=i, t=step, phase=phase, x=1.0 + i)))
            async with asyncio.timeout(10):
                while True:  # polled: the capture runs in its own task
                    if eaves.captured == 4:  # a held-back x counts once handled
                        break
                    await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        x = transcript.x(3, 5)
    assert np.all(~np.isnan(x[:, 0]))
    assert bool(x[1, 1] == 2.0) is reorder
    assert eaves.rejected == (0 if reorder else 1)


def test_transcript_counts_the_missing_states_of_corrupted_nodes(tmp_path: Path) -> None:
    """A corrupted node's state is due at every iteration of which its x was captured (a capture
    that stopped on complete x's and z^(0)'s alone lost one after a broker SIGKILL)."""
    t = topics("nlagg", "r1")
    with Transcript(tmp_path / "t.sqlite", run_id="r1") as tr:
        for it in range(3):
            for node in (0, 1):
                tr.add(t.x(node), encode(XMsg(node=node, t=it, phase="max", x=0.5)))
        for it in (0, 2):  # node 1 is corrupted; node 0 forwards nothing
            tr.add(t.adv(1), encode(AdvStateMsg(node=1, t=it, s=0.25, z={"0": 1.0}, z_in={"0": -1.0})))
        tr.commit()
        assert tr.missing_adv(2, 3) == 1
        tr.add(t.adv(1), encode(AdvStateMsg(node=1, t=1, s=0.25, z={"0": 1.0}, z_in={"0": -1.0})))
        tr.commit()
        assert tr.missing_adv(2, 3) == 0
        assert tr.missing_adv(2, 2) == 0


def test_one_neighbours_departure_claim_removes_nobody_from_the_replay(tmp_path: Path) -> None:
    """Node 1 says its neighbour 0 departed; node 0's other neighbour (5, on a ring) does not: the
    replay keeps node 0 (the claim silences it for node 1 alone). Once 5 says so too, 0 is gone."""
    cfg = RunConfig(op="max", n=6, graph="ring", t_max=50, seed=1, early_stop=True, may_depart=True)
    src = simulate_transcript(cfg, tmp_path / "src.sqlite", run_id="claims")
    with Transcript.open_read_only(src) as tr:
        config = [(str(t), bytes(p)) for t, p in tr.db.execute("SELECT topic, payload FROM messages")]
    tp = topics("nlagg", "claims")
    with Transcript(tmp_path / "t.sqlite", run_id="claims") as transcript:
        eaves = Eavesdropper(MemoryTransport(MemoryBroker(), "eve"), transcript)
        assert eaves.handle(*next(r for r in config if r[0] == tp.config)) is not None
        assert eaves.replay is not None
        claim = StatusMsg(node=1, state="running", departed={"0": 5})
        assert eaves.handle(tp.status(1), encode(claim)) is not None
        assert eaves.replay.departed == {}
        other = StatusMsg(node=5, state="running", departed={"0": 5})
        assert eaves.handle(tp.status(5), encode(other)) is not None
        assert eaves.replay.departed == {0: 5}
