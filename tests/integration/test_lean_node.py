"""A lean node (issue 42): the package without extras is a node; the lab is ``nlagg[lab]``.

A plan's node runs with every lab module refused at import (:mod:`tests.harness.lean`) beside nodes
of the full install, on a real Mosquitto; a lab command on a lean install fails in one line that
names the extra. The wheel's own requirements are checked in ``test_installed_wheel.py``.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from nlagg_node.config import load_config
from nlagg_node.deploy import PlanSpec, build_plan, security_lines, write_plan
from nlagg_node.deploy.commands import launcher_argv
from nlagg_node.extras import LAB_EXTRA, LAB_MODULES
from nlagg_node.lab.children import Child, log_tail
from nlagg_node.runtime.brokers import start_mosquitto
from tests.harness.installed import REPO
from tests.harness.lean import REFUSED, lean_nlagg

FULL = [sys.executable, "-c", "from nlagg_node.cli import main; main()"]


NAME = re.compile(r"[A-Za-z0-9_.-]+")


def _names(requirements: list[str]) -> set[str]:
    """The distribution names of PEP 508 requirements (``numpy>=1.26,<3`` -> ``numpy``)."""
    return {m.group(0) for r in requirements if (m := NAME.match(r))}


def test_the_package_without_extras_requires_no_lab_module() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not _names(project["dependencies"]) & LAB_MODULES
    assert _names(project["optional-dependencies"][LAB_EXTRA]) == LAB_MODULES - {"llvmlite"}  # numba's
    dev_extras = [r for r in project["optional-dependencies"]["dev"] if r.startswith("nlagg[")]
    assert any(LAB_EXTRA in r.removeprefix("nlagg[").rstrip("]").split(",") for r in dev_extras), dev_extras


def test_a_lab_command_on_a_lean_install_names_the_extra_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [*lean_nlagg(), "sim", "--op", "max", "--trials", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    said = [line for line in done.stderr.splitlines() if not line.startswith(REFUSED)]
    assert said == [
        "nlagg: error: module=numba: not installed; this command needs the lab: pip install 'nlagg[lab]'"
    ]


@pytest.mark.mosquitto
async def test_a_lean_node_runs_its_plan_beside_full_nodes(tmp_path: Path) -> None:
    run = load_config(None, op="median", n=5, graph="ring", value_range=(0.0, 100.0))
    root = tmp_path / "plan"
    spec = PlanSpec(run=run, run_id="lean", seed=7)
    write_plan(build_plan(spec), root)
    lines = security_lines(str(root / "broker" / "passwd"), str(root / "broker" / "acl"))
    async with start_mosquitto(extra_lines=[*lines, "user root"], allow_anonymous=False) as broker:
        # The operator's signed config of this start (a fresh run instance) first, as commands.txt says.
        launch = await asyncio.create_subprocess_exec(
            *FULL, *launcher_argv(broker.url, spec)[1:], cwd=root, stderr=asyncio.subprocess.PIPE
        )
        _, err = await launch.communicate()
        assert launch.returncode == 0, err.decode()
        procs = []
        for i in range(run.n):
            program = lean_nlagg() if i == 0 else FULL
            argv = [*program, "deploy", "node", str(root / "nodes" / f"{i}.toml"), "--broker", broker.url]
            procs.append(await Child.start(argv, log=tmp_path / f"node-{i}.log"))
        codes = await asyncio.gather(*(p.wait() for p in procs))
    assert codes == [0] * run.n, [log_tail(tmp_path / f"node-{i}.log") for i in range(run.n)]
    values = sorted(float((root / "values" / f"{i}.txt").read_text()) for i in range(run.n))
    outputs = [float(p.lines[-1].split(" output ")[1].split()[0]) for p in procs]
    assert outputs == pytest.approx([values[2]] * run.n, abs=run.tolerance * 100)
    assert REFUSED not in (tmp_path / "node-0.log").read_text()  # it never tried a lab module
