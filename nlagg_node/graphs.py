"""Communication graphs: builders, edge-list files, validation and the directed-edge layout.

Every graph is stored as an ``(m, 2)`` integer array of undirected edges ``(i, j)``
with ``i < j``, sorted lexicographically. That order is the canonical order of
the whole system: the simulator, the networked node and the adversary's replay
all visit a node's neighbours in ascending id, so sums over neighbours are
bit-for-bit identical everywhere.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from .arrays import FloatArray
from .arrays import IntArray as IntArray  # still imported from here by runtime/node.py
from .errors import ConfigError
from .limits import MAX_GRAPH_FILE_BYTES, MAX_NODES
from .rng import rng_for, rng_for_each

GraphKind = Literal["rgg", "ring", "complete", "grid", "erdos-renyi", "star", "file"]


_MAX_RESAMPLES = 10_000


def default_rgg_radius(n: int) -> float:
    """Connectivity radius ``sqrt(2 ln n / n)`` of a random geometric graph."""
    return math.sqrt(2.0 * math.log(n) / n)


def normalize_edges(n: int, edges: Sequence[Sequence[int]] | IntArray, *, source: str = "edges") -> IntArray:
    """Validate an undirected edge list and return it in canonical form.

    Raises
    ------
    ConfigError
        If ``n < 2``, an id is out of range, there is a self-loop or a duplicate
        edge, or the graph is not connected.
    """
    if n < 2:
        raise ConfigError("n", n, "a network needs at least 2 nodes")
    arr = np.asarray(edges, dtype=np.int64).reshape(-1, 2) if len(edges) else np.empty((0, 2), np.int64)
    seen: set[tuple[int, int]] = set()
    for a, b in arr.tolist():
        if not (0 <= a < n and 0 <= b < n):
            raise ConfigError(source, [a, b], f"node ids must lie in 0..{n - 1}")
        if a == b:
            raise ConfigError(source, [a, b], "self-loops are not allowed")
        key = (min(a, b), max(a, b))
        if key in seen:
            raise ConfigError(source, [a, b], "duplicate edge")
        seen.add(key)
    canon = np.array(sorted(seen), dtype=np.int64).reshape(-1, 2)
    parts = _count_parts(n, canon)
    if parts > 1:
        raise ConfigError(
            source, f"{len(canon)} edges on {n} nodes", f"graph is not connected ({parts} parts)"
        )
    return canon


def _count_parts(n: int, edges: IntArray) -> int:
    """The connected components of the graph, by union-find: plain Python, no scipy (a lean node
    checks its plan's graph too), linear in the edges (70 000 edges in about 0.4 s)."""
    parent = list(range(n))

    def root(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]  # path halving
            a = parent[a]
        return a

    parts = n
    for a, b in edges.tolist():
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[ra] = rb
            parts -= 1
    return parts


def _grid_edges(rows: int, cols: int) -> IntArray:
    """The ``rows x cols`` lattice, node ``(r, c)`` numbered ``r cols + c`` (row-major)."""
    ids = np.arange(rows * cols, dtype=np.int64).reshape(rows, cols)
    right = np.stack([ids[:, :-1].ravel(), ids[:, 1:].ravel()], axis=1)
    down = np.stack([ids[:-1, :].ravel(), ids[1:, :].ravel()], axis=1)
    return np.concatenate([right, down]).reshape(-1, 2)


def _grid_shape(n: int) -> tuple[int, int]:
    rows = math.isqrt(n)
    while n % rows:
        rows -= 1
    return rows, n // rows


@dataclass(frozen=True)
class GraphSpec:
    """How to build the graph of a run (one per trial for random kinds)."""

    kind: GraphKind = "rgg"
    n: int = 15
    radius: float | None = None
    p: float | None = None
    path: Path | None = None

    def build(self, rng: np.random.Generator) -> IntArray:
        """Build one graph; random kinds draw from ``rng`` and resample until connected."""
        n = self.n
        if n < 2:
            raise ConfigError("n", n, "a network needs at least 2 nodes")
        if self.kind == "file":
            if self.path is None:
                raise ConfigError("graph_file", None, "graph kind 'file' needs a graph file")
            file_n, edges = load_edge_list(self.path, n)
            if file_n != n:
                raise ConfigError("n", n, f"graph file {self.path} has {file_n} nodes")
            return edges
        if self.kind == "ring":
            return normalize_edges(n, [(i, (i + 1) % n) for i in range(n)] if n > 2 else [(0, 1)])
        if self.kind == "complete":
            return normalize_edges(n, [(i, j) for i in range(n) for j in range(i + 1, n)])
        if self.kind == "star":
            return normalize_edges(n, [(0, j) for j in range(1, n)])
        if self.kind == "grid":
            return normalize_edges(n, _grid_edges(*_grid_shape(n)))
        for _ in range(_MAX_RESAMPLES):
            if self.kind == "rgg":
                radius = self.radius if self.radius is not None else default_rgg_radius(n)
                pos = rng.random((n, 2))
                d2 = ((pos[:, None, :] - pos[None, :, :]) ** 2).sum(-1)
                ii, jj = np.nonzero(np.triu(d2 <= radius * radius, k=1))
            else:  # erdos-renyi
                p = self.p if self.p is not None else min(1.0, 2.0 * math.log(n) / n)
                ii, jj = np.nonzero(np.triu(rng.random((n, n)) < p, k=1))
            edges = np.stack([ii, jj], axis=1).astype(np.int64)
            if _is_connected(n, edges):
                return edges
        raise ConfigError(
            "graph", self.kind, f"no connected sample in {_MAX_RESAMPLES} tries; raise the radius or p"
        )


def _is_connected(n: int, edges: IntArray) -> bool:
    """Whether node 0 reaches every node: a breadth-first search, one frontier per matrix product."""
    adj = np.zeros((n, n), dtype=np.int64)
    adj[edges[:, 0], edges[:, 1]] = 1
    adj[edges[:, 1], edges[:, 0]] = 1
    reached = np.zeros(n, dtype=bool)
    reached[0] = True
    frontier = reached.copy()
    while frontier.any():
        frontier = (frontier.astype(np.int64) @ adj > 0) & ~reached
        reached |= frontier
    return bool(reached.all())


def load_edge_list(path: Path, expected_n: int | None = None) -> tuple[int, IntArray]:
    """Read a user edge list: CSV lines ``i,j`` or JSON ``{"n": N, "edges": [[i, j], ...]}``.

    For CSV (and JSON without ``n``), ``n`` is one more than the largest id.
    A header line ``source,target`` (any non-numeric first line) is skipped.
    Errors name the file and the line, never the file's contents (it may be private), and
    sizes are checked against :data:`~nlagg_node.limits.MAX_NODES` before anything is allocated.
    ``expected_n``: the run's n; an id outside 0..n-1 is reported as such.
    """
    from .inputs import read_input_text

    text = read_input_text(path, "graph_file", MAX_GRAPH_FILE_BYTES)  # size checked before reading
    n: int | None = None
    raw: list[list[int]] = []
    if path.suffix.lower() == ".json":
        n, raw = _json_edges(path, text)
    else:
        rows = [r for r in csv.reader(text.splitlines()) if r and not r[0].lstrip().startswith("#")]
        for k, row in enumerate(rows):
            if len(row) < 2:
                raise ConfigError("graph_file", f"{path}:{k + 1}", f"expected 'i,j', got {len(row)} field(s)")
            try:
                raw.append([int(row[0]), int(row[1])])
            except ValueError:
                if k == 0:
                    continue  # header line
                raise ConfigError("graph_file", f"{path}:{k + 1}", "not integer ids") from None
    for k, (a, b) in enumerate(raw):
        if not (0 <= a < MAX_NODES and 0 <= b < MAX_NODES):
            raise ConfigError(
                "graph_file", f"{path} edge {k + 1}", f"node ids must lie in 0..{MAX_NODES - 1}"
            )
    if not raw:
        raise ConfigError("graph_file", str(path), "holds no edges (CSV 'i,j' lines or JSON [[i, j], ...])")
    ids = [i for e in raw for i in e]
    limit = n if n is not None else expected_n
    if limit is not None and max(ids) >= limit:
        why = f"id {max(ids)} out of range for n={limit} (ids are 0..{limit - 1})"
        raise ConfigError("graph_file", str(path), why)
    if n is None:
        n = 1 + max(ids)
    return n, normalize_edges(n, raw, source=f"graph_file {path}")


def _json_edges(path: Path, text: str) -> tuple[int | None, list[list[int]]]:
    """``(n or None, edges)`` of a JSON edge list; errors name the file, not its contents."""
    from .inputs import parse_document

    doc = parse_document(text, "JSON", "graph_file", path)
    n: int | None = None
    if isinstance(doc, dict):
        n_raw = doc.get("n")
        if n_raw is not None:
            if isinstance(n_raw, bool) or not isinstance(n_raw, int | float) or n_raw != int(n_raw):
                raise ConfigError("graph_file", f"{path}: n", "must be an integer")
            n = int(n_raw)
            if not 2 <= n <= MAX_NODES:
                raise ConfigError("graph_file", f"{path}: n={n}", f"must lie in 2..{MAX_NODES}")
        doc = doc.get("edges")
    if not isinstance(doc, list):
        raise ConfigError("graph_file", str(path), "JSON must be a list of [i, j] or {'n', 'edges'}")
    raw: list[list[int]] = []
    for k, pair in enumerate(doc):
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
        ):
            raise ConfigError("graph_file", f"{path} edge {k + 1}", "expected a pair [i, j] of integers")
        raw.append([int(pair[0]), int(pair[1])])
    return n, raw


@dataclass(frozen=True)
class EdgeLayout:
    """Directed edges of one graph or of a batch of disjoint graphs (one per trial).

    ``H`` undirected edges ``(lo, hi)`` give ``E = 2H`` directed edges laid out as
    ``[hi -> lo for every pair] + [lo -> hi for every pair]``, pairs in canonical
    order. Hence the reverse of edge ``e`` is ``(e + H) % E`` (the two halves swap)
    and, restricted to one source node, the destinations appear in ascending order.

    Attributes
    ----------
    src, dst
        Source and destination node of each directed edge (global ids
        ``trial * n + i`` in a batch).
    sign
        ``a_ij`` of each directed edge ``i -> j``: +1 if ``i < j`` else -1.
    degree
        ``d_i`` of every node.
    """

    n: int
    trials: int
    src: IntArray
    dst: IntArray
    sign: FloatArray
    degree: FloatArray

    @property
    def n_nodes(self) -> int:
        return self.n * self.trials

    @property
    def n_pairs(self) -> int:
        return len(self.src) // 2

    @classmethod
    def from_graphs(cls, n: int, graphs: Sequence[IntArray]) -> EdgeLayout:
        """Stack per-trial canonical edge arrays into one disjoint union."""
        offsets = [np.asarray(g, np.int64) + b * n for b, g in enumerate(graphs)]
        pairs = np.concatenate(offsets) if offsets else np.empty((0, 2), np.int64)
        lo, hi = pairs[:, 0], pairs[:, 1]
        src = np.concatenate([hi, lo])
        dst = np.concatenate([lo, hi])
        sign = np.where(src < dst, 1.0, -1.0)
        degree = np.bincount(src, minlength=n * len(graphs)).astype(np.float64)
        return cls(n=n, trials=len(graphs), src=src, dst=dst, sign=sign, degree=degree)


def neighbours(n: int, edges: IntArray) -> list[list[int]]:
    """Ascending neighbour lists of every node."""
    nb: list[list[int]] = [[] for _ in range(n)]
    for a, b in edges.tolist():
        nb[a].append(b)
        nb[b].append(a)
    return [sorted(x) for x in nb]


def sample_graphs(spec: GraphSpec, seed: int, trials: int) -> list[IntArray]:
    """One graph per trial from the stream ``(seed, "graph", trial)`` (fixed kinds are shared).

    Trial 0 is the graph of a networked run with the same seed: the simulator, the testbed's nodes
    and ``nlagg deploy plan`` all draw it here.
    """
    if spec.kind in ("rgg", "erdos-renyi"):
        return [spec.build(gen) for gen in rng_for_each(seed, ("graph",), np.arange(trials)[:, None])]
    return [spec.build(rng_for(seed, "graph", 0))] * trials
