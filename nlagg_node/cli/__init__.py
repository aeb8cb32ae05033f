"""The ``nlagg`` command line. Each command group lives in its own module and is imported lazily."""

from __future__ import annotations

import sys

from ._app import app, exit_on_error

__all__ = ["app", "main"]


def _register() -> None:
    # Importing a command module adds its commands to ``app``.
    from . import analysis as _analysis  # noqa: F401
    from . import deploy as _deploy  # noqa: F401
    from . import net as _net  # noqa: F401
    from . import results as _results  # noqa: F401
    from . import sim as _sim  # noqa: F401
    from . import testbed as _testbed  # noqa: F401
    from . import tune as _tune  # noqa: F401


def main() -> None:
    """Console-script entry point."""
    from ..lifetime import stop_on_signals

    _register()
    with exit_on_error(), stop_on_signals():  # Ctrl-C, SIGTERM: one line, exit 128 + signal
        # Not standalone: a bad flag reaches exit_on_error as a click exception (the one-line style).
        code = app(standalone_mode=False)
    sys.exit(code if isinstance(code, int) else 0)
