"""The epoch store and the capture of many epochs over the in-memory broker (Mosquitto:
tests/integration/test_epoch_capture.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from adversary.capture.epochs import MAX_OPEN_EPOCHS, EpochCapture
from adversary.epochs import epoch_summary
from adversary.simulated import simulate_transcript
from adversary.transcript import EpochStore, Transcript
from nlagg_node.config import RunConfig
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport

PREFIX, RUN = "P", "R"


def epoch_messages(
    tmp: Path, k: int, n: int = 6, *, shared: bool = False
) -> tuple[list[tuple[str, bytes, bool]], Path]:
    """Every message epoch k publishes (a simulated run ``e{k}`` under ``P/R``), and its transcript;
    ``shared``: its statuses on the topics every epoch shares, naming the run, as nodes publish them."""
    cfg = RunConfig(op="median", n=n, t_max=120, seed=10 + k, early_stop=False)
    src = simulate_transcript(cfg, tmp / f"src-e{k}.sqlite", run_id=f"e{k}", prefix=f"{PREFIX}/{RUN}")
    with Transcript.open_read_only(src) as tr:
        rows = tr.db.execute("SELECT topic, payload, retained FROM messages ORDER BY id").fetchall()
    messages = [(str(t), bytes(p), bool(r)) for t, p, r in rows]
    return [on_shared_topic(m, k) for m in messages] if shared else messages, src


def on_shared_topic(message: tuple[str, bytes, bool], k: int) -> tuple[str, bytes, bool]:
    """A status of run ``e{k}`` moved to the topic every epoch shares, its payload naming the run."""
    topic, payload, retain = message
    head, _, rest = topic.partition(f"/e{k}/")
    if not (rest.startswith("node/") and rest.endswith("/status")):
        return message
    return f"{head}/{rest}", payload[:-1] + f',"run":"e{k}"}}'.encode(), retain


def exposed_in(src: Path) -> list[int]:
    """The nodes a simulated transcript's ground truth says were exposed."""
    truth = json.loads(Path(f"{src}.truth.json").read_text())
    return sorted(int(i) for i, t in truth["first_match"].items() if t >= 0)


def result(k: int, i: int, output: float) -> tuple[str, bytes]:
    doc = {"v": 1, "node": i, "epoch": k, "output": output, "iterations": 120, "time": 1.0e9 + k}
    return f"{PREFIX}/{RUN}/results/{i}", json.dumps(doc).encode()


async def publish(broker: MemoryBroker, messages: list[tuple[str, bytes, bool]]) -> None:
    async with MemoryTransport(broker, "nodes") as tr:
        for topic, payload, retain in messages:
            await tr.publish(topic, payload, retain=retain)


async def start(
    broker: MemoryBroker, store: EpochStore, *, keep_epochs: int | None = None, stop_epochs: int | None = None
) -> tuple[EpochCapture, asyncio.Task[None]]:
    transport = MemoryTransport(broker, "eve")
    await transport.connect()
    capture = EpochCapture(
        transport,
        store,
        summarize=epoch_summary,
        keep_epochs=keep_epochs,
        stop_epochs=stop_epochs,
        complete_grace=0.5,
        commit_every=0.05,
    )
    task = asyncio.create_task(capture.run())
    await capture.subscribed.wait()
    return capture, task


LAYOUTS = pytest.mark.parametrize("shared", [False, True], ids=["per-epoch-status", "shared-status"])


@LAYOUTS
async def test_epochs_route_to_their_transcripts_and_old_ones_are_pruned_to_summaries(
    tmp_path: Path, shared: bool
) -> None:
    broker = MemoryBroker()
    store = EpochStore(tmp_path / "store", PREFIX, RUN)
    capture, task = await start(broker, store, keep_epochs=1, stop_epochs=3)
    sources = []
    for k in range(3):
        msgs, src = epoch_messages(tmp_path, k, shared=shared)
        sources.append(src)
        await publish(broker, msgs + [(*result(k, i, 50.0 + k), True) for i in range(6)])
    async with asyncio.timeout(60):
        await task
    rows = store.epochs()
    assert [(r.epoch, r.state) for r in rows] == [(0, "pruned"), (1, "pruned"), (2, "closed")]
    assert [p.name for p in sorted((tmp_path / "store").glob("e[0-9]*"))] == ["e2.sqlite"]
    for row, src in zip(rows, sources, strict=True):
        assert row.summary is not None
        assert row.summary["exposed"] == exposed_in(src)  # the pruned epochs' findings stay
        assert row.summary["complete"] is True
    with (
        Transcript.open_read_only(store.transcript_path(2)) as tr,
        Transcript.open_read_only(sources[2]) as original,
    ):
        assert np.array_equal(tr.x(6), original.x(6), equal_nan=True)
        expected = original.statuses()  # the epoch's own (those of epochs 0 and 1 went to theirs)
        if shared:
            expected = {i: s.model_copy(update={"run": "e2"}) for i, s in expected.items()}
        assert tr.statuses() == expected
    assert [(r.epoch, r.node, r.output) for r in store.results()] == [
        (k, i, 50.0 + k) for k in range(3) for i in range(6)
    ]
    assert capture.stray == 0
    store.close()


@LAYOUTS
async def test_a_restarted_capture_resumes_its_open_epoch_and_skips_closed_ones(
    tmp_path: Path, shared: bool
) -> None:
    """With shared status topics, the statuses retained when it comes back are each node's latest,
    of epoch 0 (closed: late) or of epoch 1 (already held: stored once)."""
    broker = MemoryBroker()
    folder = tmp_path / "store"
    first, _ = epoch_messages(tmp_path, 0, shared=shared)
    second, src1 = epoch_messages(tmp_path, 1, shared=shared)
    half = len(second) // 2
    with EpochStore(folder, PREFIX, RUN) as store:
        capture, task = await start(broker, store)
        await publish(broker, first + second[:half])
        async with asyncio.timeout(30):
            while True:  # until epoch 0 is closed and every message handled
                if store.closed_count() == 1 and capture.captured == len(first) + half:
                    break
                await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert [(r.epoch, r.state) for r in store.epochs()] == [(0, "closed"), (1, "open")]
    with EpochStore(folder, PREFIX, RUN) as store:
        capture, task = await start(broker, store, stop_epochs=2)
        await publish(broker, second[half:])
        async with asyncio.timeout(30):
            await task
        assert [(r.epoch, r.state) for r in store.epochs()] == [(0, "closed"), (1, "closed")]
        assert capture.late >= 1  # epoch 0's retained config came again at the resubscription
        with (
            Transcript.open_read_only(store.transcript_path(1)) as tr,
            Transcript.open_read_only(src1) as src,
        ):
            assert tr.count(valid_only=True) == src.count(valid_only=True)  # nothing lost, nothing twice


def test_a_store_refuses_another_deployment_junk_results_and_too_many_epochs(tmp_path: Path) -> None:
    EpochStore(tmp_path / "s", PREFIX, RUN).close()
    with pytest.raises(ValueError, match="run_id='other'"):
        EpochStore(tmp_path / "s", PREFIX, "other")
    with EpochStore(tmp_path / "s") as store:
        capture = EpochCapture(MemoryTransport(MemoryBroker(), "eve"), store, summarize=epoch_summary)
        capture.handle(f"{PREFIX}/{RUN}/results/3", json.dumps({"v": 1, "node": 2}).encode())
        capture.handle(*result(0, 4, float("nan")))  # json.dumps writes NaN: not a finite output
        capture.handle(f"{PREFIX}/{RUN}/e-1/config", b"{}")
        assert capture.stray == 3
        assert store.results() == []
        for k in range(MAX_OPEN_EPOCHS + 5):  # junk under as many epochs: a bounded number opens
            capture.handle(f"{PREFIX}/{RUN}/e{k}/config", b"{}")
        assert len(store.epochs()) == MAX_OPEN_EPOCHS
        assert capture.stray == 3 + 5


def test_cleared_statuses_reruns_and_top_k_results_are_handled_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with EpochStore(tmp_path / "s", PREFIX, RUN) as store:
        capture = EpochCapture(MemoryTransport(MemoryBroker(), "eve"), store, summarize=epoch_summary)
        capture.handle(f"{PREFIX}/{RUN}/e0/config", b"{}")  # epoch 0 is open (live)
        caplog.clear()
        with caplog.at_level("WARNING", logger="nlagg.eavesdropper"):
            for i in range(3):  # each node clears its retained status and key of epoch 0
                capture.handle(f"{PREFIX}/{RUN}/e0/node/{i}/status", b"")
                capture.handle(f"{PREFIX}/{RUN}/e0/node/{i}/key", b"")
            doc = {"v": 1, "node": 2, "epoch": 1, "output": [3.5, 2.0], "iterations": 90, "time": 1.0e9}
            capture.handle(f"{PREFIX}/{RUN}/results/2", json.dumps(doc).encode())
        assert caplog.records == []
        capture.handle(f"{PREFIX}/{RUN}/e1r/node/0/status", b'{"v": 1}')  # a cold rerun: captured beside e1
        assert store.transcript_path(1, rerun=True).is_file()
        assert (capture.cleared, capture.reruns, capture.stray, capture.late) == (6, 1, 0, 0)
        assert [(r.epoch, r.node, r.output) for r in store.results()] == [(1, 2, 3.5)]


def test_the_results_of_a_range_of_epochs_are_read_alone(tmp_path: Path) -> None:
    with EpochStore(tmp_path / "s", PREFIX, RUN) as store:
        capture = EpochCapture(MemoryTransport(MemoryBroker(), "eve"), store, summarize=epoch_summary)
        for k in range(5):
            for node in (0, 1):
                capture.handle(*result(k, node, 10.0 + k))
        assert [(r.epoch, r.node) for r in store.results(since=1, until=3)] == [
            (1, 0),
            (1, 1),
            (2, 0),
            (2, 1),
        ]
        assert len(store.results()) == 10
