"""nlagg as a user gets it: a fresh clone of this checkout's HEAD and a new venv, all offline.

The venv sees the packages of the interpreter running the tests (a ``.pth`` file lists its
site-packages directories, after the venv's own), so installing nlagg downloads nothing: its
dependencies are found installed, and the build backend runs without isolation
(``PIP_NO_BUILD_ISOLATION=0`` means "no isolation" to pip). Nothing of the checkout itself is
importable from the venv: no ``PYTHONPATH``, no editable finder (a ``.pth`` line only adds a path;
the ``.pth`` files inside that path are not run).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

__all__ = ["REPO", "clone_head", "offline_env", "offline_venv", "require_wheel_backend"]


def require_wheel_backend() -> None:
    """Skip unless the interpreter can build a wheel offline (setuptools >= 70.1, or ``wheel``)."""
    has = importlib.util.find_spec("setuptools.command.bdist_wheel") or importlib.util.find_spec("wheel")
    if has is None:
        pytest.skip("building nlagg's wheel offline needs setuptools>=70.1 (pip install -e '.[dev]')")


def clone_head(dest: Path) -> Path:
    """``git clone`` of this checkout's committed HEAD into ``dest`` (what a new user downloads)."""
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(dest)], check=True, timeout=120
    )
    return dest


def offline_venv(dest: Path) -> Path:
    """A new venv (with pip) that sees this interpreter's installed packages; returns its ``bin``.

    The venv's own setuptools (Python 3.11's ensurepip brings 65.x, which builds wheels only with the
    ``wheel`` package) is removed, so pip builds with this interpreter's (>= 70.1, from the dev extras).
    """
    subprocess.run([sys.executable, "-m", "venv", str(dest)], check=True, timeout=300)
    quiet = ["--quiet", "--disable-pip-version-check"]
    uninstall = [str(dest / "bin" / "python"), "-m", "pip", "uninstall", *quiet, "--yes", "setuptools"]
    subprocess.run(uninstall, env=offline_env(dest / "bin"), check=True, timeout=300)
    site = subprocess.run(
        [str(dest / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (Path(site) / "_nlagg_tests_parent.pth").write_text("\n".join(ours) + "\n")
    return dest / "bin"


def offline_env(bin_dir: Path) -> dict[str, str]:
    """The environment of a new user's shell: the venv first on PATH, pip offline, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_"))}
    env |= {
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        "VIRTUAL_ENV": str(bin_dir.parent),
        "PIP_NO_BUILD_ISOLATION": "0",
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    return env
