"""Files the user named: reading an input, creating an output folder; one-line errors that name the
field, the path and why."""

from __future__ import annotations

from pathlib import Path

from .errors import ConfigError

__all__ = ["make_output_dir", "read_input_text"]


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


def make_output_dir(path: Path, field: str) -> None:
    """Create the output folder ``path`` (and its parents) if missing, or a :class:`ConfigError`
    naming the field, the folder and why not (a read-only place, a file in the way)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(field, str(path), "exists and is not a directory") from None
    except OSError as exc:
        raise ConfigError(field, str(path), f"cannot create this directory ({exc.strerror or exc})") from None
