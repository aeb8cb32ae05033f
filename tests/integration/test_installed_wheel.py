"""The sensor scripts' declared ranges reach ``deploy plan`` from an installed wheel (issue 33, item 3).

A source tree finds ``deploy/pi/sensors`` beside the package; a wheel has only what it ships, so the
scripts are package data. Built with ``pip wheel`` from a fresh clone and installed into a new venv.
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from nlagg_node.extras import LAB_MODULES
from tests.harness.installed import clone_head, offline_env, offline_venv, require_wheel_backend

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``bin`` of a venv with nlagg installed from a wheel built from a fresh clone of HEAD."""
    require_wheel_backend()
    root = tmp_path_factory.mktemp("wheel")
    src = clone_head(root / "src")
    bin_dir = offline_venv(root / "venv")
    env = offline_env(bin_dir)
    pip = [str(bin_dir / "python"), "-m", "pip"]
    subprocess.run(
        [*pip, "wheel", "--quiet", "--no-deps", str(src), "-w", str(root / "dist")],
        env=env,
        check=True,
        timeout=300,
    )
    (wheel,) = (root / "dist").glob("nlagg-*.whl")
    subprocess.run([*pip, "install", "--quiet", "--no-deps", str(wheel)], env=env, check=True, timeout=300)
    return bin_dir


@pytest.mark.parametrize(
    ("sensor", "expected"),
    [("/opt/nlagg/sensors/ds18b20", [-55.0, 125.0]), ("/opt/nlagg/sensors/soc-temperature", [-40.0, 110.0])],
    ids=["ds18b20", "soc-temperature"],
)
def test_installed_plan_writes_the_shipped_sensor_range(
    installed_bin: Path, tmp_path: Path, sensor: str, expected: list[float]
) -> None:
    env = offline_env(installed_bin)
    where = subprocess.run(
        [str(installed_bin / "python"), "-c", "import nlagg_node; print(nlagg_node.__file__)"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert Path(where.strip()).is_relative_to(installed_bin.parent), where  # the wheel, not this tree
    argv = [str(installed_bin / "nlagg"), "deploy", "plan", "--out", "plan", "--run-id", "pi", "--n", "4"]
    done = subprocess.run(
        [*argv, "--graph", "ring", "--value-cmd", sensor],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run = tomllib.loads((tmp_path / "plan" / "run.toml").read_text())["run"]
    assert run["value_range"] == expected


def test_the_wheel_without_extras_requires_no_lab_package(installed_bin: Path, tmp_path: Path) -> None:
    """A node's install (issue 42): every lab package is behind ``extra == "lab"`` in the wheel."""
    show = "import importlib.metadata as m, json; print(json.dumps(m.requires('nlagg')))"
    env = offline_env(installed_bin)
    out = subprocess.run(
        [str(installed_bin / "python"), "-c", show], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    requires: list[str] = json.loads(out.stdout)
    names = {r: m.group(0) for r in requires if (m := re.match(r"[A-Za-z0-9_.-]+", r))}
    lean = {name for r, name in names.items() if "extra ==" not in r}
    lab = {name for r, name in names.items() if 'extra == "lab"' in r}
    assert not lean & LAB_MODULES, sorted(lean)
    assert lab == LAB_MODULES - {"llvmlite"}  # numba brings llvmlite
    assert {"numpy", "paho-mqtt", "cryptography"} <= lean
