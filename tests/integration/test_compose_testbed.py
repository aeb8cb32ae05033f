"""The docker-compose testbed, run for real: images built here, ``docker-compose up``, exact results.

The base image comes from ``scripts/base-image`` (Debian bookworm from the apt mirror, no registry;
its rootfs is cached by the hash of its inputs in the temp dir, so it is built once per machine),
the nlagg image from ``scripts/image`` (offline wheelhouse). ``nlagg deploy compose`` writes a fresh
6-node max plan and its compose project; the test runs it as the compose file's header says, kills
node 3's container mid-run and starts it again, and checks every node's output in its logs, the
resume from the state volume, and the transcript (copied out of its volume) against the simulator
bit for bit. A private dockerd is started when no engine answers (tests/harness/docker_engine.py).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.harness.docker_engine import docker_engine

pytestmark = [pytest.mark.slow, pytest.mark.docker]

REPO = Path(__file__).resolve().parents[2]
RUN_ID, N, SEED, T_MAX, C, MU_Z = "compose", 6, 17, 1000, 3.0, 9.0  # simulator: every x exact at t_max
KILL_AT = 50  # node 3 is killed once its checkpoint has passed this iteration
IMAGE = "nlagg:compose-test"
BASE = "localhost/nlagg-base"


def _run(argv: list[str], env: dict[str, str], timeout: float, cwd: Path | None = None) -> str:
    done = subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def engine() -> Iterator[dict[str, str]]:
    with docker_engine() as env:
        yield env


@pytest.fixture(scope="module")
def images(engine: dict[str, str]) -> dict[str, str]:
    """The base image (cached) and the nlagg image; the environment the compose file reads."""
    env = {**engine, "NLAGG_BASE_CACHE": str(Path(tempfile.gettempdir()) / "nlagg-base-cache")}
    started = time.monotonic()
    print(_run([str(REPO / "scripts" / "base-image")], env, timeout=1200).strip())
    print(_run([str(REPO / "scripts" / "image"), "--base", BASE, "--tag", IMAGE], env, timeout=1200).strip())
    print(f"compose test: images ready in {time.monotonic() - started:.0f} s")
    return {**engine, "NLAGG_IMAGE": IMAGE, "NLAGG_BROKER_IMAGE": BASE}


def _checkpoint_t(path: Path) -> int:
    """The next iteration recorded in a node's checkpoint (-1 before the first one is written)."""
    try:
        return int(json.loads(path.read_text())["t"])
    except (FileNotFoundError, json.JSONDecodeError):
        return -1


@pytest.mark.timeout(2700)
def test_compose_testbed_is_exact_resumes_a_killed_node_and_replays_the_simulator(
    images: dict[str, str],
) -> None:
    from nlagg_node.config import load_config
    from nlagg_node.deploy import load_plan
    from nlagg_node.deploy.nodefile import read_node_value
    from nlagg_node.sim import simulate
    from tests.harness.verdict import assert_transcript_holds

    env = images
    work = Path(tempfile.mkdtemp(prefix="nlagg-compose-"))
    project = f"nlaggtest{uuid.uuid4().hex[:8]}"
    _run(
        [
            "nlagg",
            "deploy",
            "compose",
            "--out",
            str(work),
            "--run-id",
            RUN_ID,
            "--n",
            str(N),
            "--op",
            "max",
            "--corrupt-count",
            "2",
            "--seed",
            str(SEED),
            "--replay",
            "--t-max",
            str(T_MAX),
            "--c",
            str(C),
            "--mu-z",
            str(MU_Z),
            "--no-early-stop",  # every node runs T_MAX iterations: the kill comes mid-run
        ],
        env,
        timeout=120,
    )
    dc = ["docker-compose", "-p", project]

    def compose(*args: str, timeout: float = 300) -> str:
        return _run([*dc, *args], env, timeout=timeout, cwd=work)

    def cid(service: str) -> str:
        return compose("ps", "-q", service).strip()

    try:
        started = time.monotonic()
        compose("up", "-d", timeout=600)
        volume = _run(["docker", "volume", "inspect", "-f", "{{.Mountpoint}}", f"{project}_state-3"], env, 60)
        checkpoint = Path(volume.strip()) / f"nlagg-{RUN_ID}-node-3.json"
        node3 = cid("node-3")
        deadline = time.monotonic() + 600
        while _checkpoint_t(checkpoint) < KILL_AT:
            running = _run(["docker", "inspect", "-f", "{{.State.Running}}", node3], env, 60).strip()
            assert running == "true" or _checkpoint_t(checkpoint) < 0, (
                "node 3 ended before it could be killed"
            )
            assert time.monotonic() < deadline, f"node 3 never reached iteration {KILL_AT}"
            time.sleep(0.02)
        _run(["docker", "kill", node3], env, 60)
        assert _run(["docker", "wait", node3], env, 60).strip() == "137"
        killed_at = _checkpoint_t(checkpoint)
        assert killed_at < T_MAX, "the run ended before node 3 was killed"
        compose("start", "node-3")
        for i in range(N):
            rc = _run(["docker", "wait", cid(f"node-{i}")], env, timeout=900).strip()
            assert rc == "0", f"node {i} exited {rc}: {compose('logs', '--no-color', f'node-{i}')[-3000:]}"
        seconds = time.monotonic() - started
        try:
            _run(["docker", "wait", cid("eavesdropper")], env, timeout=60)
        except subprocess.TimeoutExpired:
            # Known runtime issue (deploy/README.md): a last will after "done" keeps it waiting.
            compose("stop", "eavesdropper")
            warnings.warn("the eavesdropper did not stop by itself; stopped it", stacklevel=1)
        logs = {i: compose("logs", "--no-color", f"node-{i}") for i in range(N)}
        _run(["docker", "cp", f"{cid('eavesdropper')}:/transcript/transcript.sqlite", str(work)], env, 120)
    finally:
        subprocess.run([*dc, "down", "-v"], env=env, cwd=work, capture_output=True, timeout=300, check=False)

    plan = load_plan(work / "plan")
    values = np.array([read_node_value(node, work / "plan") for node in plan.nodes])
    truth = float(values.max())
    for i, text in logs.items():
        found = re.findall(rf"node {i}: done, output (\S+) after {T_MAX} iterations", text)
        assert found, f"node {i} printed no result: {text[-2000:]}"
        assert float(found[-1]) == truth, (i, found[-1], truth)
    resumed = re.findall(r"node 3: resuming from the checkpoint in /state \(stage x, t = (\d+)\)", logs[3])
    assert resumed, logs[3][-3000:]
    assert KILL_AT <= int(resumed[0]) == killed_at

    sim = simulate(
        load_config(
            None,
            op="max",
            n=N,
            graph="rgg",
            trials=1,
            t_max=T_MAX,
            c=C,
            mu_z=MU_Z,
            seed=SEED,
            record="all",
            early_stop=False,
        )
    )
    edges = np.array(json.loads((work / "plan" / "graph.json").read_text())["edges"])
    assert np.array_equal(sim.graphs[0], edges)
    assert np.array_equal(sim.values[0], values)
    # Every x and z^(0) the simulator's, every corrupted node's states, nothing refused.
    assert_transcript_holds(sim, work / "transcript.sqlite", corrupt=plan.corrupted)

    # What `nlagg attack` and `nlagg report` read: the transcript, scored against the plan's values.
    _run(
        ["nlagg", "deploy", "truth", "--plan", str(work / "plan"), "--out", str(work / "summary.json")],
        env,
        60,
    )
    report = json.loads(_run(["nlagg", "attack", "--json", str(work / "transcript.sqlite")], env, 600))
    assert report["exposed"] == [int(values.argmax())], report["nodes"]  # the maximizer, no one else
    assert report["precision"] == 1.0, report["truth"]
    _run(["nlagg", "report", str(work)], env, 900)
    assert (work / "report.html").is_file()
    shutil.rmtree(work, ignore_errors=True)
    print(
        f"compose testbed: {N} nodes, {T_MAX} rounds, node 3 killed at t = {killed_at} and resumed, "
        f"{seconds:.1f} s from up to the last node done; max {truth!r} exact at every node"
    )
