"""Integration: the testbed over a real Mosquitto and over the embedded amqtt broker.

The transcript the eavesdropper stores must equal the simulator's trajectory bit for bit (every
z^(0), every x_i^(t)); an independent ``mosquitto_sub`` must see exactly protocol v1 messages.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adversary.transcript import Transcript
from nlagg_node.config import RunConfig
from nlagg_node.lab.children import Child
from nlagg_node.lab.testbed import run_testbed
from nlagg_node.runtime.mqtt import MqttTransport, parse_broker_url
from nlagg_node.runtime.public import run_edges
from nlagg_node.runtime.wire import StatusMsg, decode, encode, parse_topic, split_x_batch, topics
from nlagg_node.sim import simulate
from tests.harness.transcripts import captured_by_kind
from tests.harness.verdict import assert_transcript_is_simulation

OPS = ["max", "min", "median", "quantile", "topk", "average"]


@pytest.mark.mosquitto
@pytest.mark.parametrize("op", OPS, ids=OPS)
async def test_transcript_equals_simulator_on_mosquitto(op: str, mosquitto_url: str, tmp_path: Path) -> None:
    level = 0.3 if op == "quantile" else 0.5  # a quantile other than the median
    cfg = RunConfig(op=op, n=8, trials=1, t_max=120, seed=21, quantile=level)
    summary = await run_testbed(cfg, broker_url=mosquitto_url, in_process=True, out_dir=tmp_path)
    assert_transcript_is_simulation(cfg, tmp_path / "transcript.sqlite")
    sim = simulate(cfg.model_copy(update={"trials": 1}))
    finals = np.array([summary["final_x"][str(i)] for i in range(cfg.n)]).reshape(sim.output[0].shape)
    assert np.array_equal(finals, sim.output[0])
    assert (tmp_path / "summary.json").is_file()
    assert (tmp_path / "manifest.json").is_file()


def empty_files(folder: Path, pattern: str) -> list[Path]:
    return [p for p in folder.glob(pattern) if p.stat().st_size == 0]


@pytest.mark.mosquitto
async def test_separate_processes_with_corrupted_node(
    mosquitto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = RunConfig(op="max", n=5, graph="ring", trials=1, t_max=60, seed=3)
    started: list[list[str]] = []
    start = Child.start

    async def recording(argv: Sequence[str], **kwargs: Any) -> Child:
        started.append(list(argv))
        return await start(argv, **kwargs)

    monkeypatch.setattr(Child, "start", recording)
    summary = await run_testbed(cfg, broker_url=mosquitto_url, corrupt={1}, out_dir=tmp_path)
    nodes = [argv for argv in started if "node" in argv]
    assert len(nodes) == 5
    for argv in nodes:  # the private value and the seed come from 0600 files, not the command line (ps)
        assert {"--value", "--seed"}.isdisjoint(argv), argv
        assert {"--value-file", "--seed-file"} <= set(argv), argv
    assert not (tmp_path / "private").exists()  # and those files are gone once the nodes are done
    assert_transcript_is_simulation(cfg, tmp_path / "transcript.sqlite")
    assert summary["corrupted"] == [1]
    assert summary["iterations"] == 60
    assert summary["rounds_per_second"] > 0
    with Transcript(tmp_path / "transcript.sqlite") as tr:
        states = tr.adv_states()
        assert tr.corrupted() == [1]
        assert [s.t for s in states] == list(range(60))
        assert states[0].s == summary["private_values"]["1"]
        assert {i: st.state for i, st in tr.statuses().items()} == dict.fromkeys(range(5), "done")
    assert not empty_files(tmp_path, "node-*.log")  # a node that logged nothing leaves no file


async def test_embedded_amqtt_broker(amqtt_url: str, tmp_path: Path) -> None:
    cfg = RunConfig(op="max", n=6, trials=1, t_max=80, seed=4)
    summary = await run_testbed(cfg, broker_url=amqtt_url, in_process=True, out_dir=tmp_path)
    assert_transcript_is_simulation(cfg, tmp_path / "transcript.sqlite")
    assert summary["messages_captured"] == 1 + 6 * 80 + 2 * len(run_edges(cfg)) + 6 * 3


@pytest.mark.mosquitto
@pytest.mark.skipif(shutil.which("mosquitto_sub") is None, reason="mosquitto_sub not installed")
async def test_independent_subscriber_sees_only_protocol_messages(mosquitto_url: str, tmp_path: Path) -> None:
    host, port = parse_broker_url(mosquitto_url)
    sub = await asyncio.create_subprocess_exec(
        *("mosquitto_sub", "-h", host, "-p", str(port), "-t", "nlagg/#", "-v", "-q", "1"),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        await asyncio.sleep(0.5)  # let it subscribe
        cfg = RunConfig(op="median", n=6, trials=1, t_max=40, seed=8)
        summary = await run_testbed(cfg, broker_url=mosquitto_url, in_process=True, run_id="subcheck")
        await asyncio.sleep(0.5)
    finally:
        sub.terminate()
        raw, _ = await sub.communicate()
    lines = raw.decode().splitlines()
    kinds: dict[str, int] = {}
    for line in lines:
        topic, _, payload = line.partition(" ")
        batch = split_x_batch(topic, payload.encode(), "nlagg", "subcheck")  # the host's x's, coalesced
        if batch is not None:
            assert batch[1] == []
            kinds["batch"] = kinds.get("batch", 0) + 1
            kinds["x"] = kinds.get("x", 0) + len(batch[0])
            continue
        info, _msg = decode(topic, payload.encode(), "nlagg", "subcheck")
        kinds[info.kind] = kinds.get(info.kind, 0) + 1
    edges = len(run_edges(cfg))
    assert kinds == {"config": 1, "z0": 2 * edges, "batch": 40, "x": 6 * 40, "status": 6 * 3}
    assert len(lines) - kinds["batch"] + kinds["x"] == summary["messages_captured"]  # each x stored alone


@pytest.mark.mosquitto
async def test_junk_on_run_topics_is_rejected_and_changes_nothing(mosquitto_url: str, tmp_path: Path) -> None:
    cfg = RunConfig(op="max", n=6, trials=1, t_max=150, seed=9)
    t = topics("nlagg", "junk")
    stop = asyncio.Event()

    async def inject() -> None:
        async with MqttTransport(mosquitto_url, client_id="attacker") as tr:
            while not stop.is_set():
                await tr.publish(t.x(2), b"{not json")
                await tr.publish(t.x(3), b'{"v":1,"node":3,"t":0,"phase":"max","x":1e999}')
                await asyncio.sleep(0.01)

    task = asyncio.create_task(inject())
    try:
        summary = await run_testbed(
            cfg, broker_url=mosquitto_url, in_process=True, run_id="junk", out_dir=tmp_path
        )
    finally:
        stop.set()
        await task
    assert summary["messages_rejected"] > 0
    assert summary["messages_rejected_by_nodes"] > 0
    assert_transcript_is_simulation(cfg, tmp_path / "transcript.sqlite")


@pytest.mark.mosquitto
def test_node_command_names_missing_neighbours(mosquitto_url: str, tmp_path: Path) -> None:
    cfg_file = tmp_path / "run.toml"
    cfg_file.write_text('[run]\nop = "max"\nn = 4\ngraph = "ring"\nt_max = 10\n')
    proc = subprocess.run(
        [
            *(sys.executable, "-c", "from nlagg_node.cli import main; main()", "node", "--id", "0"),
            *("--config", str(cfg_file), "--value", "1.5", "--broker", mosquitto_url, "--run-id", "lonely"),
            *("--startup-timeout", "0.5"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "neighbour(s) [1, 3] not online within 0.5 s" in proc.stderr
    assert parse_topic("nlagg/lonely/node/0/status", "nlagg", "lonely").kind == "status"


class CuttableProxy:
    """A loopback TCP proxy whose connections the test can cut, as a flaky network would."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.writers: list[asyncio.StreamWriter] = []
        self.cuts = 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers += [writer, up_writer]
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def cut(self) -> None:
        for w in self.writers:
            w.transport.abort()
        self.writers.clear()
        self.cuts += 1

    async def close(self) -> None:
        self.cut()
        self.server.close()


@pytest.mark.mosquitto
async def test_nodes_survive_a_cut_connection(mosquitto_url: str, tmp_path: Path) -> None:
    from adversary.capture.eavesdropper import Eavesdropper
    from nlagg_node.runtime.hosted import host_nodes
    from nlagg_node.runtime.node import Node, node_will
    from nlagg_node.runtime.public import build_config_msg
    from nlagg_node.sim import draw_values

    # the fixed schedule: 1500 iterations, so the cut comes mid-run (early stopping ends at ~350)
    cfg = RunConfig(op="median", n=6, trials=1, t_max=1500, seed=12, early_stop=False)
    seen: list[str] = []  # node 0's statuses as the broker delivers them
    host, port = parse_broker_url(mosquitto_url)
    proxy = CuttableProxy(host, port)
    proxy_url = f"mqtt://127.0.0.1:{await proxy.start()}"
    t = topics("nlagg", "flaky")
    edges = run_edges(cfg)
    with Transcript(tmp_path / "transcript.sqlite", run_id="flaky") as transcript:
        async with MqttTransport(mosquitto_url, client_id="launcher") as launcher:
            await launcher.publish(t.config, encode(build_config_msg(cfg, "flaky", edges)), retain=True)
        async with MqttTransport(mosquitto_url, client_id="eve") as eve_tr:
            eaves = Eavesdropper(eve_tr, transcript)
            eve_task = asyncio.create_task(eaves.run())
            await eaves.subscribed.wait()
            s = draw_values(cfg.values, cfg.seed, 1, cfg.n)[0]
            # The host's connection carries node 0's last will, as a node process's does.
            will = node_will("nlagg", "flaky", 0)
            async with (
                MqttTransport(mosquitto_url, client_id="status-watch") as watch,
                MqttTransport(proxy_url, client_id="flaky-host", backoff_base=0.01, will=will) as tr,
            ):
                await watch.subscribe(t.status(0))
                watching = asyncio.create_task(collect_states(watch, seen))
                nodes = [
                    Node(cfg, i, s[i], tr, run_id="flaky", prefix="nlagg", edges=edges, own_transport=False)
                    for i in range(cfg.n)
                ]
                run = asyncio.create_task(host_nodes(nodes, tr, "nlagg", "flaky"))
                await asyncio.sleep(0.4)
                assert not run.done()  # the cut happens mid-run
                proxy.cut()
                await run
                assert tr.reconnects >= 1
                async with asyncio.timeout(20):
                    await watching
            async with asyncio.timeout(20):
                await eve_task
        await proxy.close()
    assert proxy.cuts >= 1
    assert_transcript_is_simulation(cfg, tmp_path / "transcript.sqlite")
    # The cut made the broker publish the will; back with its session, the node restored its status.
    after = seen[seen.index("offline") :]
    assert after == ["offline", "running", "done"], seen


async def collect_states(tr: MqttTransport, into: list[str]) -> None:
    """Append every status state delivered on ``tr`` until ``done``."""
    async for msg in tr.messages():
        _, status = decode(msg.topic, msg.payload, "nlagg", "flaky")
        assert isinstance(status, StatusMsg)
        into.append(status.state)
        if into[-1] == "done":
            return


REQUIRED_SUMMARY_FIELDS = {
    "run_id",
    "op",
    "n",
    "true_value",
    "final_x",
    "exact",
    "private_values",
    "corrupted",
    "iterations",
    "rounds_per_second",
    "messages_captured",
    "exposed_nodes",
    "transcript",
}


@pytest.mark.mosquitto
def test_testbed_command_prints_the_json_summary(mosquitto_url: str, tmp_path: Path) -> None:
    import json

    proc = subprocess.run(
        [
            *(sys.executable, "-c", "from nlagg_node.cli import main; main()", "testbed", "--n", "5"),
            *("--op", "min", "--t-max", "30", "--in-process", "--corrupt-count", "4", "--json"),
            *("--theta", "0.6", "--sigma-z", "2", "--values", "uniform"),
            *("--broker", mosquitto_url, "--out", str(tmp_path / "out")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary.keys() >= REQUIRED_SUMMARY_FIELDS
    assert summary["op"] == "min"
    assert summary["corrupted"] == [0, 1, 2, 3]
    assert summary["iterations"] == 30
    assert sorted(summary["final_x"]) == ["0", "1", "2", "3", "4"]
    assert Path(summary["transcript"]).is_file()
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {
        "transcript.sqlite",
        "summary.json",
        "manifest.json",
    }
    config = json.loads((tmp_path / "out" / "manifest.json").read_text())["config"]
    assert (config["theta"], config["sigma_z"], config["values"]) == (0.6, 2.0, "uniform")


@pytest.mark.mosquitto
@pytest.mark.slow
async def test_default_max_testbed_is_exact_with_one_process_per_node(
    mosquitto_url: str, tmp_path: Path
) -> None:
    """The issue's acceptance run: ``nlagg testbed --n 15 --op max`` at its defaults (early stopping,
    t_max = 7000 a cap): exact, and stopped at the simulator's iteration."""
    cfg = RunConfig(op="max", n=15, trials=1)
    summary = await run_testbed(cfg, broker_url=mosquitto_url, out_dir=tmp_path)
    assert summary["exact"]
    final, truth = summary["final_x"]["0"], summary["true_value"]
    assert isinstance(final, float)  # max: one value each
    assert isinstance(truth, float)
    assert abs(final - truth) <= 1e-9
    ran = int(simulate(cfg).phase_iterations[0].sum())
    assert summary["iterations"] == ran < cfg.resolved().t_max_value
    kinds, states, invalid = captured_by_kind(tmp_path / "transcript.sqlite")
    expected = {"config": 1, "x": 15 * ran, "z0": 2 * len(run_edges(cfg))}
    assert {k: kinds.get(k, 0) for k in expected} == expected
    assert not invalid, invalid
    # Every node: online, running, done. The only other status a run may show is a node's last will
    # ('offline', retained), which the broker publishes when a connection ends without a clean
    # DISCONNECT (a keepalive lapse on a loaded machine); it is a real message, so it is counted.
    wills = {i: got.count("offline") for i, got in states.items() if "offline" in got}
    others = {
        i: got for i, got in states.items() if sorted(set(got) - {"offline"}) != ["done", "online", "running"]
    }
    assert len(states) == 15, states
    assert not others, states
    assert summary["messages_captured"] == sum(expected.values()) + 15 * 3 + sum(wills.values()), (
        kinds,
        wills,
    )
    assert all(st == "done" for st in summary_states(tmp_path / "transcript.sqlite").values())


def summary_states(db: Path) -> dict[int, str]:
    with Transcript(db) as tr:
        return {i: st.state for i, st in tr.statuses().items()}


@pytest.mark.parametrize(
    ("broker_kind", "hosted"),
    [
        pytest.param("amqtt", True, id="embedded-in-process"),
        pytest.param("mosquitto", False, id="mosquitto-processes", marks=pytest.mark.mosquitto),
    ],
)
async def test_private_broker_picks_the_node_layout(broker_kind: str, hosted: bool) -> None:
    cfg = RunConfig(op="max", n=4, graph="ring", t_max=300, c=10.0, mu_z=30.0, seed=2)
    summary = await run_testbed(cfg, broker_kind=broker_kind)
    assert summary["in_process"] is hosted
    assert summary["exact"]
