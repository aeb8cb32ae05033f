"""Value ranges that sensor scripts declare, so a deployment's public ``value_range`` matches its sensors.

A sensor script carries one header line::

    # nlagg-value-range: LO HI

``nlagg deploy plan --value-cmd CMD`` reads it from the command's program (the local file, or the
script of the same name shipped with the package) and writes the range into ``run.toml`` unless
``--value-range`` is given. The shipped scripts are package data (``nlagg_node/deploy/sensor_scripts/``,
which ``deploy/pi/sensors/`` links to), so an installed wheel finds them as a source tree does.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from ..errors import ConfigError

__all__ = ["SHIPPED_SENSORS", "declared_range", "range_for_command"]

SHIPPED_SENSORS = Path(__file__).resolve().parent / "sensor_scripts"
_DECLARATION = re.compile(r"^#\s*nlagg-value-range:\s*(\S+)\s+(\S+)")


def declared_range(script: Path) -> tuple[float, float] | None:
    """The ``# nlagg-value-range: LO HI`` of a script (first 20 lines), or None."""
    try:
        head = script.read_text(errors="replace").splitlines()[:20]
    except OSError:
        return None
    for line in head:
        m = _DECLARATION.match(line.strip())
        if m:
            try:
                lo, hi = float(m.group(1)), float(m.group(2))
            except ValueError:
                raise ConfigError("value_range", line.strip(), f"{script}: not two numbers") from None
            if not lo < hi:
                raise ConfigError("value_range", [lo, hi], f"{script}: needs LO < HI")
            return lo, hi
    return None


def range_for_command(command: str) -> tuple[float, float] | None:
    """The range the program of a value command declares (None when it declares none)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if not words:
        return None
    program = Path(words[0])
    for candidate in (program, SHIPPED_SENSORS / program.name):
        if candidate.is_file():
            found = declared_range(candidate)
            if found is not None:
                return found
    return None
