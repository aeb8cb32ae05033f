"""Whether a numba kernel is in the on-disk cache, so a command can say "compiling kernels (once)".

The first simulation on a machine compiles the kernels for 20-60 s before its first trial: a
progress bar stuck at 0 meanwhile looks hung. numba keeps one index file per cached kernel
(:mod:`nlagg_node.jit` chooses its folder); when it exists the first call loads the kernel in
milliseconds, when it does not the call compiles it.
"""

from __future__ import annotations

import os

__all__ = ["COMPILING", "is_cached", "simulator_cached"]

COMPILING = "compiling kernels (once: about a minute, two on a busy machine)"
"""What a command shows while the kernels compile."""


def is_cached(dispatcher: object) -> bool:
    """Whether numba has an on-disk index for ``dispatcher`` (a ``@njit`` function); False when it
    caches nothing or the index is missing (its first call compiles)."""
    # numba exposes no public query: its FunctionCache knows the index file it would read.
    cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    index = getattr(cache_file, "_index_path", None)
    return isinstance(index, str) and os.path.exists(index)


def simulator_cached() -> bool:
    """Whether the simulator's kernel loads from the cache (importing it compiles nothing)."""
    from .sim.kernel import run_phase

    return is_cached(run_phase)
