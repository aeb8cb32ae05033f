"""The test harness never deletes the host's files through a mount (tests/harness/mounts.py).

A run that bind-mounted the host's ``/dev`` into a rootfs and was killed before unmounting used to
leave the mount behind, and the next run's ``rm -rf`` of that rootfs walked into it and deleted every
device node of the machine. Each scenario here runs in a private mount namespace of its own whose
``/dev`` is a throwaway tmpfs holding a marker file, so the hazard is reproduced without risk: the
marker must survive.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("nsenter") is None,
    reason="needs root, unshare and nsenter (util-linux) for private mount namespaces",
)

REPO = Path(__file__).resolve().parents[2]

# Runs as root in a private mount namespace: /dev becomes a throwaway tmpfs (a copy of the few
# device nodes Python and util-linux need, and a marker), then the scenario named by argv[2].
_SCENARIO = textwrap.dedent(
    """
    import os, signal, subprocess, sys
    from pathlib import Path
    from tests.harness.arm64 import PiRoot
    from tests.harness.mounts import MountedInsideError, mounts_under, remove_tree

    work, scenario = Path(sys.argv[1]), sys.argv[2]
    fake = work / "fakedev"
    fake.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(fake)], check=True)
    subprocess.run(["cp", "-a", "/dev/null", "/dev/zero", "/dev/urandom", str(fake)], check=True)
    (fake / "marker").write_text("the host's /dev")
    subprocess.run(["mount", "--bind", str(fake), "/dev"], check=True)
    root = work / "pi-installed-0123.part-1"
    (root / "etc").mkdir(parents=True)

    if scenario == "killed-run":
        # A run that mounted its chroot and was SIGKILLed before it could unmount anything.
        code = (
            "import sys, time; from pathlib import Path; from tests.harness.arm64 import PiRoot\\n"
            "PiRoot(Path(sys.argv[1]), overlay=False).__enter__(); print('mounted', flush=True)\\n"
            "time.sleep(600)"
        )
        run = subprocess.Popen([sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE, text=True)
        assert run.stdout is not None and run.stdout.readline().strip() == "mounted"
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
        left = mounts_under(root)
        remove_tree(root)  # what the next run does with a killed run's work folder
        print("left mounted:", left)
    else:
        # A mount still inside the tree: removal refuses and deletes nothing.
        (root / "dev").mkdir()
        subprocess.run(["mount", "--bind", "/dev", str(root / "dev")], check=True)
        try:
            remove_tree(root)
        except MountedInsideError as refused:
            print("refused:", refused)
    print("marker:", (Path("/dev") / "marker").exists())
    """
)


def _scenario(tmp_path: Path, name: str) -> str:
    private = ["unshare", "--mount", "--propagation", "private"]
    done = subprocess.run(
        [*private, sys.executable, "-c", _SCENARIO, str(tmp_path), name],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_killed_run_leaves_nothing_mounted_to_delete_through(tmp_path: Path) -> None:
    out = _scenario(tmp_path, "killed-run")
    assert "left mounted: []" in out, out
    assert "marker: True" in out, out


def test_removing_a_tree_with_a_mount_inside_refuses(tmp_path: Path) -> None:
    out = _scenario(tmp_path, "mounted")
    assert "refused: refusing to remove" in out, out
    assert "marker: True" in out, out
