"""Files the user named: reading an input, parsing a document, creating an output folder; one-line
errors that name the field, the path and why.

Every input is read through :func:`read_input_text`, which takes regular files only (a FIFO, a
device such as ``/dev/zero`` or a socket is refused before a byte is read, so nothing hangs or
fills memory) and refuses a file larger than its cap. :func:`parse_document` turns TOML or JSON
text into a table and refuses documents nested deeper than :data:`MAX_NESTING` and integers longer
than Python's digit limit with the same one-line error, where the parsers would raise a
``RecursionError`` or ``ValueError`` traceback.
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Any, Literal

from .errors import ConfigError

__all__ = [
    "MAX_INPUT_BYTES",
    "MAX_NESTING",
    "make_output_dir",
    "not_a_file",
    "parse_document",
    "read_input_text",
]

MAX_INPUT_BYTES = 64 << 20  # 64 MiB: the largest legitimate input (a graph or values file) is far smaller
MAX_NESTING = 64  # run configs, plans and node files nest 3 levels; JSON inputs 2


def not_a_file(path: Path) -> str | None:
    """Why ``path`` is no file to read (a folder, or nothing there), None when it is one."""
    if path.is_file():
        return None
    return "is a directory, not a file" if path.is_dir() else "no such file"


def read_input_text(path: Path, field: str, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The text of an input file, or a :class:`ConfigError` naming the field, the file and why not.

    Missing, a directory, not a regular file (FIFO, device, socket), larger than ``max_bytes``,
    unreadable, or not UTF-8 text: each gets its own one-line reason.
    """
    if path.is_dir():
        raise ConfigError(field, str(path), "is a directory, not a file")
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ConfigError(field, str(path), "no such file") from None
    except PermissionError:
        raise ConfigError(field, str(path), "permission denied (cannot read it)") from None
    except OSError as exc:
        raise ConfigError(field, str(path), f"cannot read it ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(field, str(path), "not a regular file (a device, FIFO or socket)")
        if info.st_size > max_bytes:
            raise ConfigError(field, str(path), f"{info.st_size} bytes, larger than the {max_bytes}-byte cap")
        try:
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise ConfigError(field, str(path), f"cannot read it ({exc.strerror or exc})") from None
    if len(data) > max_bytes:  # grew while we read it
        raise ConfigError(field, str(path), f"larger than the {max_bytes}-byte cap")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            field, str(path), f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def _depth(text: str, kind: Literal["TOML", "JSON"]) -> int:
    """An upper bound on the nesting of ``text``: its deepest run of open brackets outside strings."""
    depth = deepest = 0
    quote = ""
    escaped = False
    for ch in text:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\" and (kind == "JSON" or quote == '"'):
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch == '"' or (ch == "'" and kind == "TOML"):
            quote = ch
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(depth - 1, 0)
    return deepest


def parse_document(text: str, kind: Literal["TOML", "JSON"], field: str, path: Path | str) -> Any:
    """The document in ``text`` (TOML or JSON), or a :class:`ConfigError` naming the field, the file
    and why: a syntax error with its position, nesting deeper than :data:`MAX_NESTING`, an integer
    too long to convert."""
    if _depth(text, kind) > MAX_NESTING:
        raise ConfigError(field, str(path), f"not valid {kind}: nested deeper than {MAX_NESTING} levels")
    try:
        return json.loads(text) if kind == "JSON" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(field, str(path), f"not valid {kind}: {exc}") from None
    except (ValueError, RecursionError) as exc:  # an integer beyond sys.get_int_max_str_digits
        raise ConfigError(field, str(path), f"not valid {kind}: {exc}") from None


def make_output_dir(path: Path, field: str) -> None:
    """Create the output folder ``path`` (and its parents) if missing, or a :class:`ConfigError`
    naming the field, the folder and why not (a read-only place, a file in the way)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(field, str(path), "exists and is not a directory") from None
    except OSError as exc:
        raise ConfigError(field, str(path), f"cannot create this directory ({exc.strerror or exc})") from None
