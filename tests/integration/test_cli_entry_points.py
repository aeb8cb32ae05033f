"""The ``nlagg`` entry points as a user starts them, in a real process: ``python -m nlagg_node`` and a
help that loads no numerical stack (the vocabulary in-process: tests/unit/test_cli_vocabulary.py)."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from nlagg_node.cli import _register, app

runner = CliRunner()


def test_version_and_module_entry_point() -> None:
    _register()
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith("nlagg ")
    proc = subprocess.run(
        [sys.executable, "-m", "nlagg_node", "--version"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == result.output


def test_top_level_help_loads_no_numerical_stack() -> None:
    # What keeps `nlagg --help` fast (benchmarks/bench_startup.py times it): the command modules
    # import numpy, pydantic, numba and the adversary only inside the commands that use them.
    probe = (
        "import sys; sys.argv = ['nlagg', '--help']\n"
        "from nlagg_node.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = ('numpy', 'pydantic', 'numba', 'scipy', 'networkx', 'rich', 'adversary')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Usage: nlagg" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "[]"
