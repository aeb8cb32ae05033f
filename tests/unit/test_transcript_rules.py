"""The transcript applies the nodes' rules: bounded integers, phases, the barrier window, one config.

Hostile messages of every kind a node's own credentials can send (see also
``tests/integration/test_hostile.py``, which sends them through a real Mosquitto with the plan's ACL).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adversary.transcript import MAX_INVALID_PAYLOAD, Transcript
from nlagg_node.config import RunConfig
from nlagg_node.runtime.node import build_config_msg, run_edges
from nlagg_node.runtime.wire import ConfigMsg, StatusMsg, XMsg, Z0Msg, encode, topics

RUN = "r1"
TP = topics("nlagg", RUN)


def ring_config(**extra: object) -> ConfigMsg:
    """A 4-ring run on the fixed schedule: its x's carry no early-stop fields, as written here."""
    fields: dict[str, object] = {"early_stop": False, **extra}
    cfg = RunConfig(op="max", n=4, graph="ring", t_max=20, trials=1, **fields)
    return build_config_msg(cfg, RUN, run_edges(cfg))


def x_payload(i: int, t: int, x: float, phase: str = "max") -> bytes:
    return encode(XMsg(node=i, t=t, phase=phase, x=x))


def raw_x(i: int, t: int, x: float, phase: str = "max") -> bytes:
    return f'{{"v":1,"node":{i},"t":{t},"phase":"{phase}","x":{x!r}}}'.encode()


def feed_rounds(tr: Transcript, rounds: range, n: int = 4) -> None:
    for t in rounds:
        for i in range(n):
            assert tr.add(TP.x(i), x_payload(i, t, 10.0 - t)) is not None, (i, t)


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        pytest.param(raw_x(1, 2**64, 1.0), "t=18446744073709551616: Expected `int` <= 9999999", id="t-2^64"),
        pytest.param(raw_x(1, 10**12, 1.0), "t=1000000000000: Expected `int` <= 9999999", id="t-10^12"),
        pytest.param(raw_x(1, 25, 1.0), "the run has iterations 0..19", id="t-past-the-run"),
        pytest.param(raw_x(1, 1, 1.0, "min"), "phase 'min', expected 'max'", id="wrong-phase"),
        pytest.param(raw_x(1, 7, 42.0), "outside every neighbour's window", id="forged-window"),
    ],
)
def test_what_a_node_rejects_is_stored_invalid_and_the_capture_goes_on(
    tmp_path: Path, payload: bytes, why: str
) -> None:
    with Transcript(tmp_path / "t.sqlite", run_id=RUN) as tr:
        tr.add(TP.config, encode(ring_config()), retained=True)
        feed_rounds(tr, range(2))
        assert tr.add(TP.x(1), payload) is None
        feed_rounds(tr, range(2, 20))
        [(topic, error)] = tr.rejected()
        assert topic == TP.x(1)
        assert why in error
        assert tr.complete(4, 20, [], {"max"}) == (0, 0)  # every x of the run, none missing
        assert np.array_equal(tr.x(4, 20)[:, 7], np.full(4, 3.0))  # the real x^(7), not the forged 42


def test_a_forgery_before_the_config_is_judged_again_when_it_arrives(tmp_path: Path) -> None:
    with Transcript(tmp_path / "t.sqlite", run_id=RUN) as tr:
        feed_rounds(tr, range(1))
        assert tr.add(TP.x(2), x_payload(2, 15, 42.0)) is not None  # no rules yet: provisionally valid
        tr.add(TP.config, encode(ring_config()), retained=True)
        feed_rounds(tr, range(1, 20))  # the real x_2^(15) comes later and is kept
        assert tr.x(4, 20)[2, 15] == 10.0 - 15
        [(_, error)] = tr.rejected()
        assert "outside every neighbour's window" in error


@pytest.mark.parametrize(
    ("update", "why"),
    [
        pytest.param({"n": 20_000_000}, "less than or equal to 10000", id="n-2e7"),
        pytest.param({"t_max": 2_000_000_000}, "t_max", id="t_max-2e9"),
    ],
)
def test_a_huge_config_is_stored_invalid_and_sets_no_rules(tmp_path: Path, update: dict, why: str) -> None:  # type: ignore[type-arg]
    good = ring_config()
    doc = good.model_dump(by_alias=True)
    doc["run"] = {**doc["run"], **update}
    doc.update({k: v for k, v in update.items() if k == "n"})
    import json

    with Transcript(tmp_path / "t.sqlite", run_id=RUN) as tr:
        assert tr.add(TP.config, json.dumps(doc).encode()) is None
        assert why in tr.rejected()[0][1]
        assert tr.config() is None
        assert tr.add(TP.config, encode(good), retained=True) is not None  # the real one still counts
        assert tr.config() == good


def test_only_the_first_config_counts_and_a_status_is_bounded_by_the_run(tmp_path: Path) -> None:
    with Transcript(tmp_path / "t.sqlite", run_id=RUN) as tr:
        tr.add(TP.config, encode(ring_config()), retained=True)
        assert tr.add(TP.config, encode(ring_config(c=3.0))) is None
        done = StatusMsg(node=1, state="done", final=[1.0], output=[1.0], iterations=21)
        assert tr.add(TP.status(1), encode(done)) is None
        errors = [e for _, e in tr.rejected()]
        assert "a second run configuration" in errors[0]
        assert "iterations=21" in errors[1]


def test_an_epochs_transcript_takes_its_status_on_the_shared_topic_and_refuses_another_epochs(
    tmp_path: Path,
) -> None:
    epoch = topics("farm/R", "e1", shared=True)  # epoch 1 of deployment farm/R
    cfg = RunConfig(op="max", n=4, graph="ring", t_max=20, trials=1, early_stop=False)
    with Transcript(tmp_path / "t.sqlite", run_id="e1", prefix="farm/R") as tr:
        tr.add(epoch.config, encode(build_config_msg(cfg, "e1", run_edges(cfg))), retained=True)
        own = StatusMsg(node=1, state="online", run="e1")
        stale = StatusMsg(node=2, state="done", final=[1.0], output=[1.0], iterations=20, run="e0")
        assert tr.add(epoch.status(1), encode(own)) is not None
        assert tr.add(epoch.status(2), encode(stale), retained=True) is None
        [(topic, error)] = tr.rejected()
        assert (topic, "of run e0" in error) == ("farm/R/node/2/status", True)
        assert tr.statuses() == {1: own}


def test_an_undecodable_payload_is_stored_as_a_bounded_prefix(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "t.sqlite"
    with Transcript(path, run_id=RUN) as tr:
        assert tr.add(TP.x(1), b"A" * (10 << 20)) is None
    with sqlite3.connect(path) as db:
        [(size, error)] = db.execute("SELECT length(payload), error FROM messages").fetchall()
    assert size == MAX_INVALID_PAYLOAD
    assert "larger than 1048576 bytes" in error


def padded(payload: bytes, size: int = 1_000_000) -> bytes:
    """``payload`` padded with JSON whitespace to ``size`` bytes: it still decodes."""
    return payload[:-1] + b" " * (size - len(payload)) + b"}"


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        pytest.param(padded(raw_x(1, 1, 42.0)), "conflicts with the x already stored", id="conflict"),
        pytest.param(padded(raw_x(1, 7, 42.0)), "outside every neighbour's window", id="outside-window"),
    ],
)
def test_a_rejected_payload_is_stored_as_a_bounded_prefix_whatever_decodes(
    tmp_path: Path, payload: bytes, why: str
) -> None:
    import sqlite3

    path = tmp_path / "t.sqlite"
    with Transcript(path, run_id=RUN) as tr:
        tr.add(TP.config, encode(ring_config()), retained=True)
        feed_rounds(tr, range(2))
        for k in range(5):  # five different padded copies: five rejected rows
            assert tr.add(TP.x(1), payload[:-2] + b" " * k + payload[-2:]) is None
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT length(payload), error FROM messages WHERE valid = 0").fetchall()
    assert len(rows) == 5
    assert all(size == MAX_INVALID_PAYLOAD and why in error for size, error in rows)


def z0_payload(i: int, j: int, z: float) -> bytes:
    return encode(Z0Msg.model_validate({"from": i, "to": j, "group": "max", "z": z}))


@pytest.mark.parametrize("reopen", [False, True], ids=["one-capture", "restarted-capture"])
def test_an_injection_before_the_receivers_subscribed_gives_way_to_the_real_message(
    tmp_path: Path, reopen: bool
) -> None:
    """Issue 31: an x^(0) and a z^(0) published after the config, before the nodes connected, were
    never seen by the nodes; the real ones, captured after every receiver's status, are the truth."""
    path = tmp_path / "t.sqlite"
    tr = Transcript(path, run_id=RUN)
    tr.add(TP.config, encode(ring_config()), retained=True)
    assert tr.add(TP.x(1), x_payload(1, 0, 42.0)) is not None  # kept while nothing contradicts it
    assert tr.add(TP.z0(0, 1), z0_payload(0, 1, 99.0)) is not None
    if reopen:
        tr.close()
        tr = Transcript(path, run_id=RUN)
    with tr:
        for i in range(4):
            assert tr.add(TP.status(i), encode(StatusMsg(node=i, state="online"))) is not None
        for i, j in ((0, 1), (1, 0)):
            assert tr.add(TP.z0(i, j), z0_payload(i, j, -300.0 - i)) is not None
        feed_rounds(tr, range(2))
        assert tr.x(4, 2)[1, 0] == 10.0  # the real x_1^(0), not the injected 42
        z0 = tr.z0(4, np.asarray(ring_config().edges, dtype=np.int64))["max"]
        assert 99.0 not in z0.tolist()
        assert -300.0 in z0.tolist()
        errors = [e for _, e in tr.rejected()]
        assert len(errors) == 2
        assert all("subscribed (they never received it)" in e for e in errors)
        assert tr.add(TP.x(1), x_payload(1, 0, 43.0)) is None  # after the real one: a plain conflict


def test_beyond_a_nodes_quota_what_the_nodes_would_not_use_is_counted_not_stored(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "t.sqlite"
    with Transcript(path, run_id=RUN) as tr:
        tr.add(TP.config, encode(ring_config()), retained=True)
        feed_rounds(tr, range(2))
        for k in range(300):  # issue 31: 300 padded, decodable, different x's (here 100 kB each)
            assert tr.add(TP.x(1), padded(raw_x(1, 9, 42.0 + k), 100_000)) is None
        feed_rounds(tr, range(2, 20))  # the run goes on: every honest x is stored
        assert tr.complete(4, 20, [], {"max"}) == (0, 0)
        messages, dropped_bytes = tr.dropped()[1]
        stored = len(tr.rejected())
    assert stored + messages == 300
    assert dropped_bytes == messages * 100_000
    assert stored * MAX_INVALID_PAYLOAD < 4 * 40_000  # node 1's quota: a few times its honest traffic
    with sqlite3.connect(path) as db:
        [(total,)] = db.execute("SELECT SUM(length(payload)) FROM messages").fetchall()
    assert total < 200_000


def test_a_padded_message_the_nodes_use_is_stored_without_its_padding(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "t.sqlite"
    with Transcript(path, run_id=RUN) as tr:
        tr.add(TP.config, encode(ring_config()), retained=True)
        assert tr.add(TP.x(1), padded(raw_x(1, 0, 10.0), 500_000)) is not None  # first for its slot
        assert tr.x(4, 1)[1, 0] == 10.0
    with sqlite3.connect(path) as db:
        [(size,)] = db.execute("SELECT length(payload) FROM messages WHERE kind = 'x'").fetchall()
    assert size == len(raw_x(1, 0, 10.0))


def test_a_reopened_transcript_keeps_the_window(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    with Transcript(path, run_id=RUN) as tr:
        tr.add(TP.config, encode(ring_config()), retained=True)
        feed_rounds(tr, range(3))
    with Transcript(path, run_id=RUN) as tr:
        assert tr.add(TP.x(0), x_payload(0, 3, 1.5)) is not None  # every neighbour's x^(2) is stored
        assert tr.add(TP.x(0), x_payload(0, 9, 1.5)) is None


def test_a_copy_outside_the_window_counts_when_it_comes_again_in_time(tmp_path: Path) -> None:
    with Transcript(tmp_path / "t.sqlite", run_id=RUN) as tr:
        tr.add(TP.config, encode(ring_config()), retained=True)
        feed_rounds(tr, range(2))
        early = x_payload(1, 3, 7.0)
        assert tr.add(TP.x(1), early) is None  # node 0 and 2 are not at t=2 yet
        feed_rounds(tr, range(2, 3))
        assert tr.add(TP.x(1), early) is not None  # the same message, resent once they are


def test_after_a_lost_session_the_window_waits_for_every_node(tmp_path: Path) -> None:
    with Transcript(tmp_path / "t.sqlite", run_id=RUN) as tr:
        tr.add(TP.config, encode(ring_config()), retained=True)
        feed_rounds(tr, range(2))
        tr.resync()  # rounds 2..9 were lost with the broker's queues
        for i in range(4):
            assert tr.add(TP.x(i), x_payload(i, 10, 0.5)) is not None
        assert tr.add(TP.x(0), x_payload(0, 15, 0.5)) is None  # every node seen again: the window is back


def test_a_will_after_done_leaves_the_node_done(tmp_path: Path) -> None:
    """A node's ``offline`` will after its ``done`` (an unclean end) is stored, but it stays done."""
    with Transcript(tmp_path / "t.sqlite", run_id=RUN) as tr:
        tr.add(TP.config, encode(ring_config()), retained=True)
        done = StatusMsg(node=1, state="done", final=[1.0], output=[1.0], iterations=20)
        assert tr.add(TP.status(1), encode(done)) is not None
        assert tr.add(TP.status(1), encode(StatusMsg(node=1, state="offline"))) is not None
        assert tr.add(TP.status(2), encode(StatusMsg(node=2, state="offline"))) is not None
        assert {i: st.state for i, st in tr.statuses().items()} == {1: "done", 2: "offline"}
        assert tr.statuses()[1].output == [1.0]
        assert tr.done_nodes() == {1}  # what the eavesdropper counts before it stops


def test_a_graph_file_runs_config_is_one_the_eavesdropper_can_read(tmp_path: Path) -> None:
    """``nlagg testbed --graph-file``: the public config names the file (not its folder), so the
    eavesdropper rebuilds the run from it; before, it stored the config as invalid and never finished."""
    graph = tmp_path / "secret-folder" / "g.csv"
    graph.parent.mkdir()
    graph.write_text("0,1\n1,2\n2,3\n3,0\n")
    cfg = RunConfig(n=4, graph="file", graph_file=graph, trials=1, t_max=50)
    msg = build_config_msg(cfg, "r1", run_edges(cfg))
    assert msg.run["graph_file"] == "g.csv"
    with Transcript(tmp_path / "t.sqlite", run_id="r1", prefix="nlagg") as tr:
        tr.add(topics("nlagg", "r1").config, encode(msg), retained=True)
        assert tr.config() is not None
        assert tr.rejected() == []
