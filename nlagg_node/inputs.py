"""Reading an input file the user named: one-line errors that name the field, the file and why."""

from __future__ import annotations

from pathlib import Path

from .errors import ConfigError

__all__ = ["read_input_text"]


def read_input_text(path: Path, field: str) -> str:
    """The text of an input file, or a :class:`ConfigError` naming the field, the file and why not.

    Missing, a directory, unreadable, or not UTF-8 text: each gets its own one-line reason.
    """
    if path.is_dir():
        raise ConfigError(field, str(path), "is a directory, not a file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(field, str(path), "no such file") from None
    except PermissionError:
        raise ConfigError(field, str(path), "permission denied (cannot read it)") from None
    except OSError as exc:
        raise ConfigError(field, str(path), f"cannot read it ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            field, str(path), f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
