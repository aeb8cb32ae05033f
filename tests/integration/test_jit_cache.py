"""Compiled kernels: the cache lives in a user folder (never the package), loads without recompiling,
nlagg works with no writable cache at all, and the parallel simulator equals a serial run bit for bit."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import adversary
import nlagg_node

ROOT = Path(nlagg_node.__file__).resolve().parents[1]
PACKAGES = [Path(nlagg_node.__file__).parent, Path(adversary.__file__).parent]
NOBODY = 65534


def _package_cache_files() -> set[Path]:
    return {p for pkg in PACKAGES for ext in ("*.nbi", "*.nbc") for p in pkg.rglob(ext)}


def _env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "XDG_"))}
    env["PYTHONPATH"] = str(ROOT)
    env.update(overrides)
    return env


def _python(code: str, env: dict[str, str], cwd: Path, user: list[str] | None = None) -> str:
    proc = subprocess.run(
        [*(user or []), sys.executable, "-c", code],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return proc.stdout


_SIM_STATS = """
import json
from nlagg_node import load_config, simulate
from nlagg_node.sim.kernel import run_phase
simulate(load_config(op="max", trials=20, t_max=50))  # enough trials for the parallel kernel
print(json.dumps({"hits": sum(run_phase.stats.cache_hits.values()),
                  "misses": sum(run_phase.stats.cache_misses.values())}))
"""


def test_kernels_cache_in_numba_cache_dir_and_load_without_recompiling(tmp_path: Path) -> None:
    before = _package_cache_files()
    env = _env(NUMBA_CACHE_DIR=str(tmp_path / "cache"), HOME=str(tmp_path), NUMBA_NUM_THREADS="2")
    _python(_SIM_STATS, env, tmp_path)
    assert list((tmp_path / "cache").rglob("kernel.run_phase-*.nbi")), "no index written to NUMBA_CACHE_DIR"
    stats = json.loads(_python(_SIM_STATS, env, tmp_path))
    assert stats == {"hits": 1, "misses": 0}
    assert _package_cache_files() == before


def test_user_cache_folder_when_numba_cache_dir_is_unset(tmp_path: Path) -> None:
    before = _package_cache_files()
    env = _env(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "xdg"), NUMBA_NUM_THREADS="2")
    _python(_SIM_STATS, env, tmp_path)
    assert list((tmp_path / "xdg" / "nlagg" / "numba").rglob("*.nbi"))
    assert _package_cache_files() == before


def _can_run_as_nobody() -> bool:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    probe = subprocess.run(
        [
            *_as_nobody(),
            sys.executable,
            "-c",
            "import numba, typer, nlagg_node.cli, adversary.analysis.experiments",
        ],
        env=_env(HOME="/nonexistent"),
        cwd="/",
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


def _as_nobody() -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


@pytest.fixture
def open_work() -> Iterator[Path]:
    """A folder every user can enter and write (pytest's own temp tree is 0700, closed to uid 65534)."""
    work = Path(tempfile.mkdtemp(prefix="nlagg-jit-"))
    work.chmod(0o777)
    try:
        yield work
    finally:
        shutil.rmtree(work)


@pytest.mark.slow
def test_sim_and_experiment_run_without_a_writable_cache_or_home(open_work: Path) -> None:
    """The Docker image's user: HOME=/nonexistent, cannot write the package folder.

    As root with setpriv and an interpreter that uid 65534 can read, the commands run as
    that user; elsewhere they run as this user with a NUMBA_CACHE_DIR that cannot be
    created (and the package folder must stay untouched, writable or not).
    """
    before = _package_cache_files()
    work = open_work
    user = _as_nobody() if _can_run_as_nobody() else None
    env = _env(HOME="/nonexistent")
    if user is None:
        env["NUMBA_CACHE_DIR"] = "/dev/null/nlagg-cache"
    cli = "from nlagg_node.cli import main; main()"
    for args in (["sim", "--trials", "5"], ["experiment", "min", "--trials", "50", "--out", str(work)]):
        proc = subprocess.run(
            [*(user or []), sys.executable, "-c", cli, *args],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr
    assert (work / "min.json").exists()
    assert _package_cache_files() == before


_THREADS = """
import numba, numpy as np
from nlagg_node import load_config, simulate
cfg = load_config(op="topk", k=2, trials=37, t_max=400, record="every:7")
def run(threads):
    numba.set_num_threads(threads)
    r = simulate(cfg)
    return [r.output, r.matched, r.first_match, r.converged_iterations, r.recorded_x, r.mse]
serial, parallel = run(1), run(numba.config.NUMBA_NUM_THREADS)
print(numba.config.NUMBA_NUM_THREADS, all(np.array_equal(a, b) for a, b in zip(serial, parallel)))
"""


def test_parallel_simulation_equals_serial_bit_for_bit(tmp_path: Path) -> None:
    out = _python(_THREADS, _env(NUMBA_NUM_THREADS="4", NUMBA_CACHE_DIR=str(tmp_path)), tmp_path)
    assert out.split() == ["4", "True"]


def test_kernel_cache_follows_the_sources_it_compiles_in(tmp_path: Path) -> None:
    """numba keys a cache on the kernel's own file only: the simulator's kernel also compiles
    pdmm's and termination's rules, so its cache folder is named by a digest of those sources,
    and an edit to one of them is compiled anew, never loaded stale."""
    from nlagg_node import pdmm, termination
    from nlagg_node.jit import source_digest

    env = _env(NUMBA_CACHE_DIR=str(tmp_path / "cache"), HOME=str(tmp_path), NUMBA_NUM_THREADS="2")
    _python(_SIM_STATS, env, tmp_path)
    folder = tmp_path / "cache" / f"src-{source_digest([pdmm, termination])}"
    assert list(folder.rglob("kernel.run_phase-*.nbi"))

    sys.path.insert(0, str(tmp_path))
    try:
        (tmp_path / "rules_probe.py").write_text("def f(x):\n    return x + 1\n")
        rules_probe = importlib.import_module("rules_probe")
        before = source_digest([rules_probe])
        (tmp_path / "rules_probe.py").write_text("def f(x):\n    return x + 2\n")
        assert source_digest([rules_probe]) != before
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("rules_probe", None)
