"""What a node installs and what only the lab needs (``pip install 'nlagg[lab]'``).

The package without extras is a node: ``nlagg node`` and ``nlagg deploy node`` import none of
:data:`LAB_MODULES`. The simulator's kernels (numba), the analysis (scipy), the plots (matplotlib),
the dashboard (starlette, uvicorn), the embedded broker (amqtt) and the site planner (networkx) are
the ``lab`` extra; a command that needs one of them says so in one line (:func:`missing_lab_line`).
"""

from __future__ import annotations

__all__ = ["LAB_EXTRA", "LAB_MODULES", "missing_lab_line"]

LAB_EXTRA = "lab"
"""The extra that installs the lab: ``pip install 'nlagg[lab]'``."""

LAB_MODULES: frozenset[str] = frozenset(
    {"amqtt", "llvmlite", "matplotlib", "networkx", "numba", "scipy", "starlette", "uvicorn"}
)
"""Top-level modules only the lab imports (numba brings llvmlite); a node runs without any of them."""


def missing_lab_line(exc: ModuleNotFoundError) -> str | None:
    """The one line for a lab module that is not installed (None: ``exc`` is about another module)."""
    top = (exc.name or "").split(".")[0]
    if top not in LAB_MODULES:
        return None
    return f"module={top}: not installed; this command needs the lab: pip install 'nlagg[{LAB_EXTRA}]'"
