"""Documented upper bounds on every size a run description or a wire message can ask for.

Every integer that sizes an allocation or is stored (node ids, iteration counters, phase lengths)
is checked against these before anything is allocated, so a hostile or mistyped number fails with
one line naming the field instead of exhausting memory or overflowing SQLite's 64-bit integers.

=======================  ===========  =====================================================
bound                    value        what it limits
=======================  ===========  =====================================================
``MAX_NODES``            10 000       n of a run, node ids in graph files and on the wire
``MAX_T_MAX``            1 000 000    iterations of one phase (``t_max``, ``avg_t_max``)
``MAX_ITERATIONS``       10 000 000   iterations of a whole run (every phase), ``t`` on the wire
``MAX_NODE_ITERATIONS``  100 000 000  n times the run's iterations: the eavesdropper's x array
                                      (800 MB of float64 at the bound)
``MAX_GRAPH_FILE_BYTES`` 4 MiB        a graph file read from disk: checked before it is read, as
                                      every run publishes its edge list in its retained config
                                      (1 MiB, at least 6 bytes an edge): 4x that for the file's
                                      own spelling (CSV or JSON, spaces, CRLF)
=======================  ===========  =====================================================
"""

from __future__ import annotations

__all__ = [
    "MAX_GRAPH_FILE_BYTES",
    "MAX_ITERATIONS",
    "MAX_NODES",
    "MAX_NODE_ITERATIONS",
    "MAX_T_MAX",
]

MAX_NODES = 10_000
MAX_T_MAX = 1_000_000
MAX_ITERATIONS = 10_000_000
MAX_NODE_ITERATIONS = 100_000_000
MAX_GRAPH_FILE_BYTES = 4 << 20
