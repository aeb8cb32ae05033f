"""The README's commands run as written, from a fresh clone, as a new user would (issue 33, acceptance).

Every ``bash`` block's lines and every ``python`` block run in order in a fresh clone of HEAD, in a
new venv that installs nlagg with the README's own ``pip install '.[lab]'`` (offline: the venv sees the test
interpreter's packages, :mod:`tests.harness.installed`). The test-suite command itself is not run, only
checked to be what CI runs.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.harness.installed import REPO, clone_head, offline_env, offline_venv, require_wheel_backend

TEST_SUITE = "bash scripts/test"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
# What differs between two runs of the first command: run ids, addresses, speed, the broker of the layout.
VARYING = re.compile(
    r"tb-[0-9a-f]{8}|mqtt://\S+|[\d.]+ rounds/s|wall [\d.]+ s|broker \w+|\d+ messages captured"
)
TABLE = (
    "\u2502",
    "\u2503",
    "\u250f",
    "\u2521",
    "\u2514",
)  # rich's box lines: their width follows the terminal


def readme_commands(text: str) -> list[tuple[str, str]]:
    """``(language, command)`` in order: each line of a bash block (comments cut), each python block."""
    out: list[tuple[str, str]] = []
    for lang, body in FENCE.findall(text):
        if lang == "python":
            out.append(("python", body))
        elif lang == "bash":
            lines = (re.sub(r"\s+#.*$", "", ln).strip() for ln in body.splitlines())
            out += [("bash", ln) for ln in lines if ln and not ln.startswith("#")]
    return out


def example_lines(text: str) -> list[str]:
    """The lines of the README's example output (its first ``text`` block) that a run of the first
    command prints too: not the layout's own line nor the table's, run ids, addresses and speeds blanked."""
    body = next(body for lang, body in FENCE.findall(text) if lang == "text")
    lines = (" ".join(ln.split()) for ln in body.splitlines())
    return [VARYING.sub("*", ln) for ln in lines if ln and not ln.startswith(("embedded broker", *TABLE))]


def run_in_group(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a command in a process group of its own, ended as a whole if it outlives its time."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=1200)
    except BaseException:  # a timeout here or pytest's: leave no testbed or broker behind
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def test_readme_lists_the_two_commands_on_top() -> None:
    commands = readme_commands((REPO / "README.md").read_text())
    assert commands[0][1].startswith("pip install '.[lab]' && nlagg ")
    assert commands[1] == ("bash", TEST_SUITE)
    assert TEST_SUITE in (REPO / ".ci" / "run").read_text()
    assert (REPO / "scripts" / "test").is_file()
    assert len((REPO / "README.md").read_text().splitlines()) <= 150


@pytest.mark.slow
@pytest.mark.timeout(2400)  # a testbed of 17 processes on a loaded machine: minutes
def test_readme_commands_run_as_written(tmp_path: Path) -> None:
    require_wheel_backend()
    clone = clone_head(tmp_path / "nlagg")
    env = offline_env(offline_venv(tmp_path / "venv"))
    outputs: dict[str, str] = {}
    for lang, command in readme_commands((clone / "README.md").read_text()):
        if command == TEST_SUITE:
            continue
        argv = ["python", "-c", command] if lang == "python" else ["bash", "-c", command]
        done = run_in_group(argv, clone, env)
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        outputs[command] = done.stdout + done.stderr
        print(f"$ {command}\n{outputs[command]}")  # with -s: what a user sees
    first = next(iter(outputs.values()))
    assert "exact" in first
    printed = VARYING.sub("*", " ".join(first.split()))  # as one line: the terminal's width wraps lines
    for line in example_lines((clone / "README.md").read_text()):
        assert line in printed, f"the README's example output says {line!r}; the command printed\n{first}"
    assert "exposed honest nodes" in first
    warned = [text for cmd, text in outputs.items() if "--init from-above" in cmd]
    assert warned
    assert all("far beyond the ideal world" in text for text in warned)
    assert (clone / "runs" / "tour" / "report.html").is_file()
