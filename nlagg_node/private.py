"""Private files (a node's checkpoint and keys, private values, passwords, bundles): one writer.

:func:`write_private` writes atomically (a temporary file beside the target, fsync, rename,
fsync of the folder): a reader, a node restarted after a crash among them, sees the previous
content or the new one, never a torn file. The file is created 0600 before a byte is written, so
a secret is never readable by others, not even for a moment, and folders it has to create are
0700. Folders that exist already keep their mode: a ``--state-dir`` may be a shared place.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["PRIVATE_DIR_MODE", "PRIVATE_FILE_MODE", "open_private", "private_dir", "write_private"]

PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as a folder, created 0700 (its missing parents too) when it does not exist."""
    folder = Path(path)
    missing = [folder, *folder.parents]
    missing = missing[: next((k for k, p in enumerate(missing) if p.is_dir()), len(missing))]
    # One level at a time: mkdir(parents=True) would make the parents with the default mode. The
    # umask can only take bits away from 0700.
    for level in reversed(missing):
        level.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
    return folder


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """A file descriptor of ``path`` opened with ``flags`` (plus ``O_CREAT``), a new file created 0600
    and an existing one set to 0600; its folder is made with :func:`private_dir` when missing."""
    flags |= os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, PRIVATE_FILE_MODE)
    except FileNotFoundError:
        private_dir(Path(path).parent)
        fd = os.open(path, flags, PRIVATE_FILE_MODE)
    os.fchmod(fd, PRIVATE_FILE_MODE)  # a file left by an older version may be 0644
    return fd


def write_private(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write ``data`` (text is UTF-8) to ``path``, atomically and durably, as a 0600 file.

    The temporary file is ``path`` with ``.tmp`` appended; one writer per file is assumed.
    """
    target = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = target.with_name(target.name + ".tmp")
    fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return target
