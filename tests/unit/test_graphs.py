"""Graph builders, edge-list files and their validation."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from nlagg_node import ConfigError, EdgeLayout, GraphSpec, load_edge_list, normalize_edges, rng_for
from nlagg_node.limits import MAX_GRAPH_FILE_BYTES

KINDS = ["rgg", "ring", "complete", "grid", "erdos-renyi", "star"]


@pytest.mark.parametrize("kind", KINDS, ids=KINDS)
@pytest.mark.parametrize("n", [2, 7, 16], ids=["n2", "n7", "n16"])
def test_builders_give_connected_canonical_graphs(kind: str, n: int) -> None:
    edges = GraphSpec(kind=kind, n=n).build(rng_for(0, "graph", 0))  # type: ignore[arg-type]
    g = nx.Graph(edges.tolist())
    assert sorted(g.nodes) == list(range(n))
    assert nx.is_connected(g)
    assert np.all(edges[:, 0] < edges[:, 1])
    assert edges.tolist() == sorted(edges.tolist())


def test_expected_sizes() -> None:
    assert len(GraphSpec("complete", 15).build(rng_for(0))) == 105
    assert len(GraphSpec("ring", 15).build(rng_for(0))) == 15
    assert len(GraphSpec("star", 15).build(rng_for(0))) == 14
    assert len(GraphSpec("grid", 16).build(rng_for(0))) == 24


def test_rgg_is_resampled_until_connected_and_reproducible() -> None:
    spec = GraphSpec("rgg", 15, radius=0.35)
    a = spec.build(rng_for(4, "graph", 0))
    b = spec.build(rng_for(4, "graph", 0))
    assert np.array_equal(a, b)
    assert nx.is_connected(nx.Graph(a.tolist()))


@pytest.mark.parametrize(
    ("edges", "match"),
    [
        pytest.param([(0, 0), (0, 1)], "self-loops", id="self-loop"),
        pytest.param([(0, 1), (1, 0), (1, 2)], "duplicate", id="duplicate"),
        pytest.param([(0, 1), (2, 3)], "not connected", id="disconnected"),
        pytest.param([(0, 9)], "node ids", id="out-of-range"),
    ],
)
def test_invalid_edge_lists_name_the_problem(edges: list[tuple[int, int]], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        normalize_edges(4, edges)


def test_n_below_two_is_rejected() -> None:
    with pytest.raises(ConfigError, match="n=1"):
        normalize_edges(1, [])


def test_edge_list_files(tmp_path: Path) -> None:
    csv_file = tmp_path / "g.csv"
    csv_file.write_text("source,target\n0,1\n1,2\n# comment\n2,0\n")
    n, edges = load_edge_list(csv_file)
    assert n == 3
    assert edges.tolist() == [[0, 1], [0, 2], [1, 2]]
    json_file = tmp_path / "g.json"
    json_file.write_text(json.dumps({"n": 4, "edges": [[3, 2], [0, 1], [1, 2]]}))
    n, edges = load_edge_list(json_file)
    assert n == 4
    assert edges.tolist() == [[0, 1], [1, 2], [2, 3]]
    bad = tmp_path / "bad.csv"
    bad.write_text("0,1\nx,y\n")
    with pytest.raises(ConfigError, match=r"bad\.csv:2"):
        load_edge_list(bad)


def test_edge_layout_orders_each_nodes_out_edges_by_neighbour() -> None:
    graphs = [GraphSpec("rgg", 9).build(rng_for(1, "graph", b)) for b in range(3)]
    layout = EdgeLayout.from_graphs(9, graphs)
    h = layout.n_pairs
    assert np.array_equal(layout.src[:h], layout.dst[h:])
    assert np.array_equal(layout.dst[:h], layout.src[h:])
    for g in range(layout.n_nodes):
        out = layout.dst[layout.src == g]
        assert np.all(np.diff(out) > 0)
    assert np.array_equal(layout.sign, np.where(layout.src < layout.dst, 1.0, -1.0))


def test_a_graph_file_over_the_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big.csv"
    with path.open("wb") as f:
        f.truncate(MAX_GRAPH_FILE_BYTES + 1)  # sparse: nothing to parse, only its size counts
    with pytest.raises(ConfigError, match=f"graph_file=.*larger than the {MAX_GRAPH_FILE_BYTES}-byte cap"):
        load_edge_list(path)
