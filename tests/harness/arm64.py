"""An arm64 Raspberry Pi OS-like root filesystem under qemu-user emulation, for the Pi tests.

``scripts/pi-rootfs`` builds the base (Debian bookworm arm64 with python3, python3-venv, systemd;
cached by its inputs' hash) and registers qemu-aarch64 with binfmt_misc. :func:`installed_rootfs`
adds what ``deploy/pi/install.sh`` makes of it from a clean state (the venv with nlagg and its
dependencies from PyPI's aarch64 wheels), cached by the hash of the base, the installer and the
dependency list; :class:`PiRoot` mounts a throwaway overlay of that (so a test never changes the
cache) with /proc, /sys and /dev bound in.

Every mount lives in a private mount namespace of its own (tests/harness/mounts.py), so a killed
run leaves nothing mounted on the host; the shared cache is built under a lock in a work folder of
the run's own, and trees are removed only when nothing is mounted inside them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tests.harness.mounts import MountNamespace, cache_lock, die_with_parent, remove_tree

__all__ = [
    "CACHE",
    "SOURCE_IN_ROOT",
    "PiRoot",
    "aarch64_wheelhouse",
    "base_rootfs",
    "copy_source",
    "installed_rootfs",
    "unavailable",
]

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(tempfile.gettempdir()) / "nlagg-pi-cache"
QEMU = Path("/usr/bin/qemu-aarch64-static")
SOURCE_IN_ROOT = "home/pi/nlagg"  # where the Pi walk-through clones the repository
INSTALLER = f"/{SOURCE_IN_ROOT}/deploy/pi/install.sh"
_MARK = ".nlagg-installed.json"
# What the host's pip needs to fetch wheels for a Pi: 64-bit ARM Linux, CPython 3.11 (bookworm's).
AARCH64 = [
    "--only-binary=:all:",
    *("--platform", "manylinux2014_aarch64", "--platform", "manylinux_2_17_aarch64"),
    *("--platform", "manylinux_2_28_aarch64", "--python-version", "3.11", "--implementation", "cp"),
]
# Passed into the chroot, so its pip goes where the host's goes (no other host variable is).
PASSED_ENV = (
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "PIP_INDEX_URL",
)
_OFFLINE = ("No matching distribution", "Could not find a version", "NewConnectionError", "Max retries")


def unavailable() -> str | None:
    """Why the emulated Pi cannot run here, or None; registers qemu-aarch64 with binfmt_misc if needed."""
    if os.geteuid() != 0:
        return "needs root (mmdebstrap --mode=root, binfmt_misc, chroot, mounts)"
    missing = [tool for tool in ("mmdebstrap", "chroot", "mount", "umount") if shutil.which(tool) is None]
    if not QEMU.exists():
        missing.append("qemu-aarch64-static")
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install mmdebstrap qemu-user-static)"
    done = subprocess.run(
        [str(REPO / "scripts" / "pi-rootfs"), "--binfmt"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return done.stderr.strip() or f"scripts/pi-rootfs --binfmt exited {done.returncode}"
    return None


def base_rootfs() -> tuple[Path, float]:
    """The cached arm64 rootfs from ``scripts/pi-rootfs`` and the seconds it took to get it."""
    started = time.monotonic()
    done = subprocess.run(
        [str(REPO / "scripts" / "pi-rootfs")],
        env={**os.environ, "NLAGG_PI_CACHE": str(CACHE)},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, f"scripts/pi-rootfs exited {done.returncode}: {done.stderr[-3000:]}"
    print(done.stderr.strip())
    return Path(done.stdout.strip().splitlines()[-1]), time.monotonic() - started


def copy_source(root: Path) -> Path:
    """Copy this checkout's files (tracked and untracked, not ignored) to the Pi's clone location.

    Whatever was there is removed first (through :meth:`PiRoot.remove` for a mounted root).
    """
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    dest = root / SOURCE_IN_ROOT
    assert not dest.exists(), f"{dest} exists: remove it first"
    for rel in filter(None, listed.decode().split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def aarch64_wheelhouse(dest: Path) -> None:
    """Wheels of nlagg's dependencies for aarch64 (and its build backend), fetched by the host's pip."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    argv = [sys.executable, "-m", "pip", "download", "--quiet", *AARCH64, "-d", str(dest)]
    subprocess.run([*argv, *deps, "setuptools>=68", "wheel"], check=True, timeout=900)


def _install_key(base: Path) -> str:
    """What the cached install depends on: the base rootfs, the installer, the dependency list."""
    digest = hashlib.sha256(base.name.encode())
    for rel in ("deploy/pi/install.sh", "pyproject.toml"):
        digest.update((REPO / rel).read_bytes())
    return digest.hexdigest()[:16]


def installed_rootfs(base: Path, timeout: float = 1800) -> tuple[Path, dict[str, Any]]:
    """The base with ``install.sh`` run in it from a clean state (cached); and how long that took.

    Built under the cache's lock (a second run waits, then reuses the result) as a full copy of
    ``base`` (``cp -a``) in a work folder of this run's own; the installer runs inside it under
    emulation, as root, without a bundle; the result is kept in the cache by :func:`_install_key`.
    """
    root = CACHE / f"pi-installed-{_install_key(base)}"
    with cache_lock(CACHE, "pi-installed"):
        if (root / _MARK).is_file():
            return root, {**json.loads((root / _MARK).read_text()), "cached": True}
        _sweep(root.name)
        return root, {**_install_into(base, root, timeout), "cached": False}


def _sweep(keep: str) -> None:
    """Remove every other installed rootfs and every work folder a killed run left (under the lock)."""
    for stale in CACHE.glob("pi-installed-*"):  # earlier installers' or dependencies' (~900 MB each)
        if stale.name != keep and stale.is_dir():
            remove_tree(stale)


def _install_into(base: Path, root: Path, timeout: float) -> dict[str, Any]:
    """Run the installer on a copy of ``base``, move the result to ``root`` marked as done; the timings."""
    part = root.with_name(f"{root.name}.part-{os.getpid()}")
    remove_tree(part)
    started = time.monotonic()
    subprocess.run(["cp", "-a", str(base), str(part)], check=True, timeout=600)
    copied = time.monotonic() - started
    copy_source(part)
    with PiRoot(part, overlay=False) as pi:
        started = time.monotonic()
        out = pi.run(["bash", INSTALLER], timeout=timeout, check=False)
        if "install.sh: done." not in out and any(hint in out for hint in _OFFLINE):
            # The emulated pip reaches no index: the host's pip fetches the aarch64 wheels instead.
            aarch64_wheelhouse(pi.path("/home/pi/wheels"))
            out = pi.run(["bash", INSTALLER, "--wheelhouse", "/home/pi/wheels"], timeout=timeout, check=False)
        assert "install.sh: done." in out, out[-3000:]
        install = time.monotonic() - started
    info = {"copy_seconds": round(copied, 1), "install_seconds": round(install, 1), "log": out[-2000:]}
    (part / _MARK).write_text(json.dumps(info))
    remove_tree(root)
    part.rename(root)
    return info


class PiRoot:
    """A chroot into ``lower`` (through a throwaway overlay in ``work`` unless ``overlay=False``).

    /proc, /dev and (unless ``bind_sys=False``, where a test fakes sensor files under /sys) /sys are
    bound in and the host's resolv.conf copied, so pip inside reaches what the host reaches. Every
    mount is made in a private mount namespace (:class:`~tests.harness.mounts.MountNamespace`): the
    host never sees them, and they end with the namespace on exit or when this process is killed.
    Files inside are reached through :meth:`path`.
    """

    def __init__(
        self, lower: Path, work: Path | None = None, *, overlay: bool = True, bind_sys: bool = True
    ) -> None:
        self.lower = lower
        self.overlay = overlay
        self.bind_sys = bind_sys
        self.work = work
        self.root = lower
        self._ns = MountNamespace()

    def _mount(self, argv: Sequence[str], target: Path) -> None:
        self._ns.view(target).mkdir(parents=True, exist_ok=True)
        self._ns.run(["mount", *argv, str(target)])

    def __enter__(self) -> Self:
        self._ns.__enter__()
        try:
            if self.overlay:
                assert self.work is not None, "an overlay needs a work directory"
                upper, scratch, self.root = (self.work / d for d in ("upper", "scratch", "root"))
                upper.mkdir(parents=True)
                scratch.mkdir()
                opts = f"lowerdir={self.lower},upperdir={upper},workdir={scratch}"
                self._mount(["-t", "overlay", "overlay", "-o", opts], self.root)
            self._mount(["-t", "proc", "proc"], self.root / "proc")
            if self.bind_sys:
                self._mount(["--rbind", "/sys"], self.root / "sys")
            self._mount(["--bind", "/dev"], self.root / "dev")
            resolv = self.path("/etc/resolv.conf")
            resolv.unlink(missing_ok=True)
            shutil.copy(Path("/etc/resolv.conf").resolve(), resolv)
        except BaseException:
            self._ns.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._ns.close()

    def argv(self, argv: Sequence[str], cwd: str = "/") -> list[str]:
        """The host command line that runs ``argv`` inside the root, in ``cwd`` (a path inside it)."""
        return self._ns.argv(self._chroot(argv, cwd))

    def _chroot(self, argv: Sequence[str], cwd: str) -> list[str]:
        env = [
            "env",
            "-i",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG=C.UTF-8",
        ]
        env += [f"{name}={os.environ[name]}" for name in PASSED_ENV if name in os.environ]
        return ["chroot", str(self.root), *env, "sh", "-c", 'cd "$0" && exec "$@"', cwd, *argv]

    def run(self, argv: Sequence[str], *, timeout: float = 600, cwd: str = "/", check: bool = True) -> str:
        """Run ``argv`` inside the root; its stdout and stderr together (asserted to exit 0 if ``check``)."""
        # In a PID namespace of its own whose first process dies with this one (--kill-child): a
        # killed run leaves no installer behind writing into a tree the next run removes.
        done = subprocess.run(
            self._ns.argv(["unshare", "--pid", "--fork", "--kill-child", *self._chroot(argv, cwd)]),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            preexec_fn=die_with_parent,
        )
        output = done.stdout + done.stderr
        if check:
            assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}: {output[-3000:]}"
        return output

    def remove(self, inside: str) -> None:
        """Remove the tree at ``inside`` (an absolute path in the root), never through a mount."""
        self._ns.remove_tree(self.root / inside.lstrip("/"))

    def path(self, inside: str) -> Path:
        """The host path of ``inside`` (an absolute path in the root), seen through the namespace."""
        return self._ns.view(self.root / inside.lstrip("/"))


@contextlib.contextmanager
def timed(into: dict[str, float], key: str) -> Iterator[None]:
    """Record the seconds the block took under ``into[key]``."""
    started = time.monotonic()
    try:
        yield
    finally:
        into[key] = round(time.monotonic() - started, 1)
