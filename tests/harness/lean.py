"""A lean node's interpreter: this one, with every lab module refused at import.

``pip install nlagg`` without extras installs none of :data:`~nlagg_node.extras.LAB_MODULES`; a
child started with :func:`lean_nlagg` behaves as such an install would: importing one of them
raises :class:`ModuleNotFoundError` (a finder at the head of ``sys.meta_path``), whatever this
interpreter has installed, and says so on stderr (:data:`REFUSED`), so a test sees an attempt even
where the code caught it.
"""

from __future__ import annotations

import sys

from nlagg_node.extras import LAB_MODULES

__all__ = ["REFUSED", "lean_nlagg"]

REFUSED = "lean install: refused "
"""What the child writes on stderr, with the module's name, for each lab import it refused."""

_REFUSE = """
import importlib.abc, sys

class _Lean(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            print(f"lean install: refused {{name}}", file=sys.stderr)
            raise ModuleNotFoundError(f"No module named {{name!r}} (a lean install)", name=name)
        return None

sys.meta_path.insert(0, _Lean())
sys.argv[0] = "nlagg"
from nlagg_node.cli import main
main()
"""


def lean_nlagg() -> list[str]:
    """The ``nlagg`` argv prefix of a lean install (``[python, "-c", ...]``)."""
    return [sys.executable, "-c", _REFUSE.format(blocked=set(LAB_MODULES))]
