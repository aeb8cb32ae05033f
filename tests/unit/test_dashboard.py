"""The dashboard's model, without a server: incremental reads, findings, listen parsing (its HTTP server:
tests/integration/test_dashboard_http.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adversary.attack import attack_arrays, attack_transcript
from adversary.live import PublicRun, replay_exposures
from adversary.reporting.dashboard import DashboardState, is_loopback, parse_listen
from adversary.simulated import simulate_transcript
from adversary.transcript import Transcript
from nlagg_node.config import RunConfig
from nlagg_node.errors import ConfigError
from tests.harness.transcripts import finished_max_run


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished max run on 8 nodes, node 0 corrupted, as a transcript (no ground truth beside it)."""
    return finished_max_run(tmp_path_factory.mktemp("dash"))


def _caught_up(state: DashboardState) -> None:
    state.poll()
    while state.more:
        state.poll()


def test_finished_transcript_gives_the_attacks_findings(finished: Path) -> None:
    state = DashboardState(finished)
    _caught_up(state)
    report = attack_transcript(finished)
    assert state.finished
    assert state.t == report.iterations - 1
    nodes = state.nodes_at(state.t)["nodes"]
    for f, view in zip(report.findings, nodes, strict=True):
        assert view["state"] == ("honest" if f.status == "interval" and f.upper == np.inf else f.status)
        if f.status in ("exposed", "corrupted"):
            assert view["value"] == f.value
    doc = state.snapshot()
    assert doc["ran"] == report.iterations == 400  # ran to the cap: the page says no more than 'finished'
    assert [e["node"] for e in doc["exposures"]] == sorted(report.exposed, key=lambda i: report.exposed[i].t)
    assert len(doc["columns"]) <= state.max_columns
    assert all(len(col) == 8 for col in doc["columns"])
    state.close()


def test_a_run_that_stopped_early_shows_the_attacks_findings_and_output(tmp_path: Path) -> None:
    # Early stopping (the default) ends this median run at t = 647 of 3000: the last x's are those of
    # the stop, not of the schedule's end.
    path = tmp_path / "median.sqlite"
    simulate_transcript(RunConfig(op="median", n=8, t_max=3000, seed=3), path, corrupted=[0])
    report = attack_transcript(path)
    assert report.iterations == 647  # the run's, not the schedule's 3000
    assert report.extra["captured_x"] == report.extra["expected_x"] == 8 * 647
    state = DashboardState(path)
    _caught_up(state)
    assert state.finished
    assert state.t == report.iterations - 1
    assert report.output is not None
    doc = state.snapshot()
    assert doc["output"] == report.output
    assert (doc["early_stop"], doc["ran"]) == (True, 647)  # the page says it stopped early, and where
    views = state.nodes_at(state.t)["nodes"]
    assert [v["state"] for v in views][:1] == ["corrupted"]
    for f, view in zip(report.findings, views, strict=True):
        if f.status in ("exposed", "corrupted"):
            assert (view["state"], view["value"]) == (f.status, f.value)
    state.close()


@pytest.mark.parametrize("t", [0, 150, 399], ids=["first", "middle", "last"])
def test_slider_findings_equal_the_attack_on_the_cut_transcript(finished: Path, t: int) -> None:
    state = DashboardState(finished)
    _caught_up(state)
    replay = state.replay
    assert replay is not None
    cut = attack_arrays(
        replay.n, state.edges, replay.phases, replay.cs, replay.theta, replay.z0, replay.x[:, : t + 1],
        corrupted=state.corrupted,
    )  # fmt: skip
    views = state.nodes_at(t)["nodes"]
    for f, view in zip(cut.findings, views, strict=True):
        if f.status == "interval" and np.isfinite(f.upper):
            assert (view["state"], view["upper"]) == ("interval", f.upper)
        elif f.status != "interval":
            assert (view["state"], view["value"]) == (f.status, f.value)
    state.close()


def test_a_growing_transcript_is_read_incrementally(finished: Path, tmp_path: Path) -> None:
    with Transcript(finished) as src:
        rows = src.db.execute("SELECT topic, payload, received FROM messages ORDER BY id").fetchall()
        run_id = src.run_id
    growing = tmp_path / "growing.sqlite"
    writer = Transcript(growing, run_id=run_id)
    state: DashboardState | None = None
    seen_t = []
    for part in np.array_split(np.arange(len(rows)), 5):
        for k in part:
            topic, payload, received = rows[int(k)]
            writer.add(str(topic), bytes(payload), received=float(received))
        writer.commit()
        state = state or DashboardState(growing)
        _caught_up(state)
        seen_t.append(state.t)
    writer.close()
    assert state is not None
    assert seen_t == sorted(seen_t)
    assert seen_t[0] < seen_t[-1] == 399
    assert state.finished
    assert state.last_id == len(rows)
    whole = DashboardState(finished)
    _caught_up(whole)
    assert state.snapshot()["nodes"] == whole.snapshot()["nodes"]
    state.close()
    whole.close()


def test_add_xs_equals_add_x_one_by_one() -> None:
    from adversary.live import LiveReplay

    rng = np.random.default_rng(0)
    edges = np.array([[0, 1], [1, 2]])
    from nlagg_node.schedule import phase_c, plan_phases

    cfg = RunConfig(op="max", n=3, t_max=5, graph="ring")
    phases = plan_phases(cfg)
    cs = [phase_c(cfg, p) for p in phases]
    nodes, ts = rng.integers(-1, 4, 40), rng.integers(-1, 6, 40)
    xs = rng.normal(size=40)
    one, many = LiveReplay(3, edges, phases, cs, 1.0), LiveReplay(3, edges, phases, cs, 1.0)
    for i, t, x in zip(nodes, ts, xs, strict=True):
        one.add_x(int(i), int(t), float(x))
    many.add_xs(nodes, ts, xs)
    np.testing.assert_array_equal(one.x, many.x)
    assert [one.ready(t) for t in range(5)] == [many.ready(t) for t in range(5)]


def test_replayed_exposures_give_the_same_report_as_a_fresh_replay(finished: Path) -> None:
    state = DashboardState(finished)
    _caught_up(state)
    r = state.replay
    assert r is not None
    full = replay_exposures(PublicRun(r.n, state.edges, r.phases, r.cs, r.theta, r.z0, r.x))
    for t in (50, 300):
        fresh = attack_arrays(r.n, state.edges, r.phases, r.cs, r.theta, r.z0, r.x[:, :t])
        reused = attack_arrays(r.n, state.edges, r.phases, r.cs, r.theta, r.z0, r.x[:, :t], replayed=full)
        assert fresh.findings == reused.findings
    state.close()


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (":8080", ("127.0.0.1", 8080)),
        ("8080", ("127.0.0.1", 8080)),
        ("0.0.0.0:9000", ("0.0.0.0", 9000)),
        ("[::1]:0", ("::1", 0)),
    ],
    ids=["port-only", "bare-port", "any-host", "ipv6"],
)
def test_parse_listen(spec: str, expected: tuple[str, int]) -> None:
    assert parse_listen(spec) == expected


@pytest.mark.parametrize("spec", [":http", "host:70000"], ids=["not-a-number", "out-of-range"])
def test_parse_listen_rejects(spec: str) -> None:
    with pytest.raises(ConfigError, match="dashboard"):
        parse_listen(spec)


@pytest.mark.parametrize(
    ("host", "loopback"), [("127.0.0.1", True), ("::1", True), ("localhost", True), ("0.0.0.0", False)]
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_not_a_transcript_is_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="transcript"):
        DashboardState(tmp_path / "missing.sqlite")
    bogus = tmp_path / "bogus.sqlite"
    bogus.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(ConfigError, match="not a transcript"):
        DashboardState(bogus)
