"""A node's private value source, declared and read in one place.

A source is a constant, a file whose first line is the value (e.g. a sensor export), or a shell
command that prints it (a sensor script). ``nlagg node --value/--value-file/--value-cmd`` declares one
(:func:`source_from_flags`), a node file stores one (``[value]`` of ``nodes/<i>.toml``), ``nlagg deploy
plan`` gives every node one and reads the range a sensor script declares (:func:`declared_range_of`);
:func:`read_value` reads the number, :func:`stored_value` the one a constant or a file holds.
"""

from __future__ import annotations

import math
import subprocess
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from .errors import ConfigError
from .inputs import read_input_text

__all__ = [
    "ValueKind",
    "ValueSource",
    "declared_range_of",
    "read_value",
    "source_from_flags",
    "stored_value",
]

ValueKind = Literal["constant", "file", "command"]
COMMAND_TIMEOUT = 60.0
"""Seconds a value command may take."""


class ValueSource(BaseModel):
    """Where a node's private value comes from.

    ``constant``: ``value``. ``file``: the first number in ``path`` (e.g. a sensor export).
    ``command``: the first number a shell command prints, e.g.
    ``awk '{print $1/1000}' /sys/class/thermal/thermal_zone0/temp`` (SoC temperature in °C).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: ValueKind
    value: float | None = None
    path: str | None = None
    command: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ValueSource:
        given = {"constant": self.value, "file": self.path, "command": self.command}
        if given[self.source] is None:
            field = {"constant": "value", "file": "path", "command": "command"}[self.source]
            raise ValueError(f"value.{field}=None: source {self.source!r} needs it")
        extra = [k for k, v in given.items() if v is not None and k != self.source]
        if extra:
            raise ValueError(f"value.source={self.source!r}: also gives {extra[0]} (give exactly one source)")
        if self.value is not None and not math.isfinite(self.value):
            raise ValueError(f"value.value={self.value!r}: must be a finite number")
        return self

    @property
    def flag(self) -> str:
        """The ``nlagg node`` flag that declares this source."""
        return {"constant": "value", "file": "value_file", "command": "value_cmd"}[self.source]


def source_from_flags(
    value: float | None, value_file: str | Path | None, value_cmd: str | None
) -> ValueSource | None:
    """The source of ``--value`` / ``--value-file`` / ``--value-cmd`` (None when none is given)."""
    flags = (("value", value), ("value_file", value_file), ("value_cmd", value_cmd))
    given = [(name, v) for name, v in flags if v is not None]
    if len(given) > 1:
        raise ConfigError(given[1][0], given[1][1], f"give one value source (also got {given[0][0]})")
    if value is not None:
        return ValueSource(source="constant", value=_number(repr(value), "value"))
    if value_file is not None:
        return ValueSource(source="file", path=str(value_file))
    if value_cmd is not None:
        return ValueSource(source="command", command=value_cmd)
    return None


def _number(text: str, field: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ConfigError(field, text.strip()[:60], "not a number") from None
    if not math.isfinite(value):
        raise ConfigError(field, text.strip(), "must be a finite number")
    return value


def _first_line(path: Path, field: str) -> float:
    lines = [ln for ln in read_input_text(path, field).splitlines() if ln.strip()]
    if not lines:
        raise ConfigError(field, str(path), "file is empty")
    try:
        return _number(lines[0], field)
    except ConfigError as exc:
        raise ConfigError(field, str(path), f"first line {lines[0].strip()[:40]!r}: {exc.reason}") from None


def read_value(source: ValueSource, base: Path = Path()) -> float:
    """The value a source gives now: a file is read (relative to ``base``), a command run."""
    if source.source == "constant" and source.value is not None:
        return source.value
    if source.source == "file":
        return _first_line(base / str(source.path), "value_file")
    command = str(source.command)
    proc = subprocess.run(
        command, shell=True, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False, cwd=base
    )
    if proc.returncode != 0:
        raise ConfigError("value_cmd", command, f"exited with {proc.returncode}: {proc.stderr.strip()[:200]}")
    return _number(proc.stdout, "value_cmd")


def stored_value(source: ValueSource, base: Path) -> float:
    """The value a constant or a file holds (a command is not run: refused)."""
    if source.source == "command":
        raise ConfigError("value.source", source.source, "only constant and file sources hold a value")
    try:
        return read_value(source, base)
    except ConfigError as exc:
        raise ConfigError("value.path", exc.value, exc.reason) from None


def declared_range_of(source: ValueSource | None) -> tuple[float, float] | None:
    """The public range a command source's sensor script declares (``# nlagg-value-range: LO HI``)."""
    if source is None or source.command is None:
        return None
    from .deploy.sensors import range_for_command

    return range_for_command(source.command)
