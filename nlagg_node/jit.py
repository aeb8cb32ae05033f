"""Compiled kernels and where their on-disk cache lives.

nlagg's numba kernels (the simulator's loop, the KSG estimator) are compiled on first
use and cached on disk so that later processes load them in milliseconds. numba's
default would write the cache next to the source, into the installed package
(``site-packages/nlagg_node/sim/__pycache__``): pip never removes those files, and a
user who cannot write the package folder gets ``RuntimeError: cannot cache function``.
Here the cache goes to one folder per user instead:

* ``$NUMBA_CACHE_DIR`` when that variable is set (numba's own convention), else
* ``platformdirs.user_cache_dir("nlagg")/numba`` (``~/.cache/nlagg/numba`` on Linux,
  which honours ``$XDG_CACHE_HOME``),

and when that folder cannot be created or written (a service user whose HOME does not
exist, a read-only NUMBA_CACHE_DIR), the kernels are compiled in memory, every process
anew, and never written into the package.

numba keys a cached kernel on its own source file only: a kernel that calls functions of
other modules (the simulator's kernel compiles :mod:`nlagg_node.pdmm`'s and
:mod:`nlagg_node.termination`'s update rules) would load stale code after those modules
change (an editable install, a development tree). ``njit(depends=(module, ...))`` caches such
a kernel in a subfolder named by a digest of those modules' sources, so a change to any of
them compiles it anew.

How, without surprises: :func:`njit` points numba's ``config.CACHE_DIR`` at the folder
only while it decorates one of nlagg's kernels (numba fixes a function's cache location
at decoration), then restores it. Importing nlagg sets no environment variable and
changes no numba setting for anyone else's functions, and nothing happens before a
kernel module (``nlagg_node.sim.kernel``, ``adversary.analysis.ksg_kernels``) is imported, which
the simulator and the estimator do on first use.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


@functools.cache
def cache_dir() -> Path | None:
    """The folder nlagg's compiled kernels are cached in, or None when no writable one exists.

    Evaluated once per process: ``$NUMBA_CACHE_DIR`` if set, else the user cache folder
    (platformdirs), created if needed and checked by writing a temporary file in it.
    """
    env = os.environ.get("NUMBA_CACHE_DIR", "")
    if env:
        root = Path(env)
    else:
        import platformdirs

        root = Path(platformdirs.user_cache_dir("nlagg", appauthor=False)) / "numba"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=root):
            pass
    except OSError:
        return None
    return root


def source_digest(modules: Sequence[ModuleType]) -> str:
    """A short digest of the source files of ``modules`` (what a cached kernel was compiled from)."""
    h = hashlib.sha256()
    for module in sorted(modules, key=lambda m: m.__name__):
        h.update(module.__name__.encode() + b"\0" + Path(str(module.__file__)).read_bytes())
    return h.hexdigest()[:16]


def njit(*, depends: Sequence[ModuleType] = (), **options: Any) -> Callable[[F], F]:
    """``numba.njit(cache=True, **options)`` with the cache in :func:`cache_dir` (no cache if None).

    Use it as ``@njit(parallel=True)``; ``cache`` must not be passed. ``depends``: the modules
    whose functions the kernel compiles in (its cache follows their sources, see the module).
    """
    import numba
    from numba.core import config

    def decorate(fn: F) -> F:
        root = cache_dir()
        if root is not None and depends:
            root = root / f"src-{source_digest(depends)}"
            try:
                root.mkdir(exist_ok=True)
            except OSError:
                root = None
        if root is None:
            return numba.njit(cache=False, **options)(fn)  # type: ignore[no-any-return]
        saved = config.CACHE_DIR  # type: ignore[attr-defined]
        config.CACHE_DIR = str(root)  # type: ignore[attr-defined]
        try:
            return numba.njit(cache=True, **options)(fn)  # type: ignore[no-any-return]
        finally:
            config.CACHE_DIR = saved  # type: ignore[attr-defined]

    return decorate
