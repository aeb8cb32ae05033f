"""Private files (issue 31): a node's checkpoint, its key and every other secret are 0600 in 0700 folders."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from adversary.transcript import EpochStore, Transcript
from nlagg_node.config import RunConfig
from nlagg_node.private import write_private
from nlagg_node.runtime.checkpoint import CheckpointStore
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import Node, run_edges
from nlagg_node.sim import draw_values

RUN = "private"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """The common 022: without the writer's care, files would come out 0644 and folders 0755."""
    old = os.umask(0o022)
    yield
    os.umask(old)


async def test_a_nodes_checkpoint_is_0600_in_a_0700_folder(tmp_path: Path) -> None:
    cfg = RunConfig(n=4, op="average", graph="ring", t_max=30, trials=1, seed=5)  # sealed z^(0): a key each
    values = draw_values(cfg.values, cfg.seed, 1, cfg.n)[0]
    state = tmp_path / "state" / "nodes"  # neither folder exists yet
    broker = MemoryBroker()

    async def one(i: int) -> None:
        store = CheckpointStore(state, RUN, i)
        tr = MemoryTransport(broker, f"node-{i}")
        async with Node(cfg, i, values[i], tr, run_id=RUN, edges=run_edges(cfg), checkpoint=store) as node:
            await node.run()

    async with asyncio.timeout(60):
        await asyncio.gather(*(one(i) for i in range(cfg.n)))
    files = sorted(p.name for p in state.iterdir())
    assert {f"nlagg-{RUN}-node-{i}{ext}" for i in range(cfg.n) for ext in (".json", ".xlog", ".key")} <= set(
        files
    )
    assert {name: mode(state / name) for name in files} == dict.fromkeys(files, 0o600)
    assert (mode(tmp_path / "state"), mode(state)) == (0o700, 0o700)


def test_write_private_tightens_an_old_file_and_keeps_an_existing_folder(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    old = shared / "secret.txt"
    old.write_text("old")
    old.chmod(0o644)
    write_private(old, "new")
    assert (old.read_text(), mode(old), mode(shared)) == ("new", 0o600, 0o755)
    assert sorted(p.name for p in shared.iterdir()) == ["secret.txt"]  # no temporary file left


def test_write_private_creates_every_missing_folder_0700(tmp_path: Path) -> None:
    path = write_private(tmp_path / "a" / "b" / "key", b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    assert [mode(p) for p in (tmp_path / "a", tmp_path / "a" / "b", path)] == [0o700, 0o700, 0o600]


def test_a_transcript_and_an_epoch_store_are_0600(tmp_path: Path) -> None:
    with Transcript(tmp_path / "transcript.sqlite", run_id=RUN, prefix="nlagg"):
        pass
    assert mode(tmp_path / "transcript.sqlite") == 0o600
    with EpochStore(tmp_path / "store", prefix="nlagg", run_id=RUN):
        pass
    assert mode(tmp_path / "store") == 0o700
    assert all(mode(p) == 0o600 for p in (tmp_path / "store").iterdir())
