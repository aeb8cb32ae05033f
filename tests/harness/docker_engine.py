"""A Docker engine for the compose tests: the one already running, else a private ``dockerd``.

The private daemon runs in a network namespace of its own, given a user-mode network by
slirp4netns, so its bridges and iptables chains never meet another daemon's (measured recipe:
/work/shared/CONTAINER-NOTES.md in the team's notes; ``ip netns exec`` is avoided because it
remounts /sys, which dockerd refuses). ``nsenter`` execs dockerd, so the PIDs this module starts are
the daemons themselves: they are stopped by PID, the namespace is removed and the daemon's
directories are deleted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.harness.mounts import remove_tree

TOOLS = ("docker", "dockerd", "docker-compose", "mmdebstrap", "slirp4netns", "nsenter", "ip")
APT_PACKAGES = "docker.io docker-compose mmdebstrap slirp4netns util-linux iproute2"


def unavailable() -> str | None:
    """Why the compose testbed cannot run here, or None."""
    if sys.platform != "linux":
        return "needs Linux"
    if os.geteuid() != 0:
        return "needs root (dockerd, mmdebstrap --mode=root, network namespaces)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install {APT_PACKAGES})"
    return None


def _answers(env: dict[str, str], timeout: float = 20) -> bool:
    try:
        probe = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            env=env,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return probe.returncode == 0


def _stop(proc: subprocess.Popen[bytes], grace: float) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


@contextlib.contextmanager
def docker_engine() -> Iterator[dict[str, str]]:
    """Yield the environment (``DOCKER_HOST``) of a working Docker engine.

    An engine that already answers is used as it is. Otherwise a private dockerd is started and,
    on exit, stopped together with everything this function started.
    """
    env = dict(os.environ)
    if _answers(env):
        yield env
        return
    root = Path(tempfile.mkdtemp(prefix="nlagg-dockerd-"))
    netns = f"nlagg-dockerd-{os.getpid()}"
    sock = root / "docker.sock"
    env["DOCKER_HOST"] = f"unix://{sock}"
    procs: list[tuple[subprocess.Popen[bytes], float]] = []
    made_netns = False
    try:
        subprocess.run(["ip", "netns", "add", netns], check=True, capture_output=True, timeout=30)
        made_netns = True
        with open(root / "slirp4netns.log", "wb") as log:
            slirp = subprocess.Popen(
                [
                    "slirp4netns",
                    "--configure",
                    "--mtu=65520",
                    "--disable-host-loopback",
                    "--netns-type=path",
                    f"/run/netns/{netns}",
                    "tap0",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        procs.append((slirp, 10))
        with open(root / "dockerd.log", "wb") as log:
            dockerd = subprocess.Popen(
                [
                    "nsenter",
                    f"--net=/run/netns/{netns}",
                    "dockerd",
                    "--data-root",
                    str(root / "data"),
                    "--exec-root",
                    str(root / "exec"),
                    "--pidfile",
                    str(root / "dockerd.pid"),
                    "-H",
                    env["DOCKER_HOST"],
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        procs.insert(0, (dockerd, 60))  # stopped first: it stops its containers and containerd
        deadline = time.monotonic() + 120
        while not (sock.exists() and _answers(env, timeout=10)):
            if dockerd.poll() is not None or time.monotonic() > deadline:
                tail = (root / "dockerd.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"private dockerd did not come up: {tail}")
            time.sleep(0.5)
        yield env
    finally:
        for proc, grace in procs:
            _stop(proc, grace)
        if made_netns:
            subprocess.run(["ip", "netns", "del", netns], check=False, capture_output=True, timeout=30)
        remove_tree(root, unmount_first=True)  # dockerd's overlays, if it left any
