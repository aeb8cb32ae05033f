"""Mounts that cannot outlive their run, trees removed without crossing a mount, caches built under a lock.

A chroot with the host's ``/dev``, ``/proc`` and ``/sys`` bound into it is a trap for every later
``rm -rf`` of its folder: the walk goes through the bind mounts and deletes the host's device nodes
and cgroups. Three rules keep the test suite from ever doing that:

- :class:`MountNamespace`: every mount a test makes lives in a private mount namespace held by one
  child process that dies with its parent (``PR_SET_PDEATHSIG``), so a killed run leaves nothing
  mounted and nothing another process could delete through. Files inside are reached from here
  through ``/proc/PID/root``.
- :func:`remove_tree`: refuses a tree that has a mount inside it (as ``/proc/self/mountinfo``
  shows), and never crosses into another file system while it walks (``rm --one-file-system``).
- :func:`cache_lock`: builds into a shared cache happen under an exclusive ``flock``; a second run
  waits for the first and then reuses what it built.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = [
    "MountNamespace",
    "MountedInsideError",
    "cache_lock",
    "die_with_parent",
    "mounts_under",
    "remove_tree",
]

_PR_SET_PDEATHSIG = 1


class MountedInsideError(RuntimeError):
    """A tree to be removed has mount points inside it: removing it would delete through them."""

    def __init__(self, root: Path, mounts: Sequence[Path]) -> None:
        listed = ", ".join(str(m) for m in mounts[:5])
        super().__init__(f"refusing to remove {root}: {len(mounts)} mount(s) inside it ({listed})")
        self.root = root
        self.mounts = list(mounts)


def _unescape(field: str) -> str:
    """A mountinfo path field with its octal escapes (``\\040`` for a space) decoded."""
    return field.encode().decode("unicode_escape")


def mounts_under(root: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> list[Path]:
    """The mount points at or below ``root`` in the mount namespace ``mountinfo`` describes."""
    top = os.path.realpath(root)
    found = []
    for line in mountinfo.read_text().splitlines():
        point = _unescape(line.split()[4])
        if point == top or point.startswith(top.rstrip("/") + "/"):
            found.append(Path(point))
    return found


def remove_tree(root: Path, *, unmount_first: bool = False) -> None:
    """Remove ``root`` like ``rm -rf``, but never through a mount point.

    With ``unmount_first``, whatever is mounted inside (a daemon's leftovers) is detached first,
    deepest first, and removal goes on if that left nothing mounted.

    Raises
    ------
    MountedInsideError
        When anything is (still) mounted at or below ``root``: nothing is removed then.
    """
    if unmount_first:
        for point in sorted(mounts_under(root), key=lambda p: len(p.parts), reverse=True):
            subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=60, check=False)
    _remove(root, Path("/proc/self/mountinfo"), [])


def _remove(root: Path, mountinfo: Path, prefix: Sequence[str]) -> None:
    """Remove ``root`` unless ``mountinfo`` shows a mount inside; the rm runs under ``prefix``."""
    if Path(os.path.abspath(root)).is_relative_to("/proc"):
        raise ValueError(f"root={root}: a path through /proc names another mount namespace's view")
    inside = mounts_under(root, mountinfo)
    if inside:
        raise MountedInsideError(root, inside)
    # --one-file-system: a mount appearing between the check and the walk is skipped, not entered.
    rm = [*prefix, "rm", "-rf", "--one-file-system", "--", str(root)]
    subprocess.run(rm, check=True, timeout=900, capture_output=True)


@contextlib.contextmanager
def cache_lock(folder: Path, name: str) -> Iterator[None]:
    """Hold an exclusive lock on ``folder/name.lock`` (waiting for any other holder) for the block."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"{name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def die_with_parent() -> None:
    """A ``preexec_fn``: the child gets SIGKILL when the process that started it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


class MountNamespace:
    """A private mount namespace, held open by one sleeping child, for the mounts of one run.

    Commands run in it through :meth:`argv` (``nsenter``); the host sees none of its mounts. On exit,
    or when this process is killed, the holder dies, and with the last process in it the namespace
    and every mount in it go away.
    """

    def __init__(self) -> None:
        self._holder: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The holder's process id (its ``/proc/PID/root`` shows the namespace's view)."""
        assert self._holder is not None, "the namespace is not open"
        return self._holder.pid

    def __enter__(self) -> Self:
        self._holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sleep", "infinity"],
            preexec_fn=die_with_parent,
        )
        deadline = time.monotonic() + 30
        own = os.readlink("/proc/self/ns/mnt")
        # unshare execs sleep once the namespace exists: wait for the holder's namespace to differ.
        while os.readlink(f"/proc/{self.pid}/ns/mnt") == own:
            if self._holder.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("unshare --mount did not start a private mount namespace")
            time.sleep(0.01)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Kill the holder; the namespace ends once no process of it is left."""
        if self._holder is not None:
            self._holder.kill()
            self._holder.wait(timeout=30)
            self._holder = None

    def argv(self, argv: Sequence[str]) -> list[str]:
        """The host command line that runs ``argv`` inside the namespace."""
        return ["nsenter", f"--target={self.pid}", "--mount", "--", *argv]

    def run(self, argv: Sequence[str], *, timeout: float = 60) -> None:
        """Run ``argv`` inside the namespace; raise with its output if it fails."""
        done = subprocess.run(self.argv(argv), capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")

    def remove_tree(self, root: Path) -> None:
        """:func:`remove_tree` as seen from inside the namespace (its mounts, not the host's)."""
        _remove(root, Path(f"/proc/{self.pid}/mountinfo"), ["nsenter", f"--target={self.pid}", "--mount"])

    def view(self, path: Path) -> Path:
        """The host path through which ``path`` is seen as the namespace sees it."""
        return Path(f"/proc/{self.pid}/root") / str(path).lstrip("/")
