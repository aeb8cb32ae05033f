"""Raspberry Pi nodes, actually run: an arm64 Debian under qemu joins an x86 network bit for bit.

``scripts/pi-rootfs`` builds a Raspberry Pi OS-like root filesystem (Debian bookworm arm64 with
python3, python3-venv and systemd; cached by its inputs' hash), ``deploy/pi/install.sh`` runs in
it exactly as on a Pi (tests/harness/arm64.py: once from a clean state, cached; then again in a throwaway
overlay with this test's node bundle, and a third time, which must change nothing), and
``systemd-analyze verify`` checks the installed unit. Then a plan's Mosquitto (password file, graph
ACL), the eavesdropper and 5 nodes run on the host and node 5 inside the rootfs, under emulation,
started as its systemd unit starts it (``nlagg deploy node``), reading its value through
``--value-cmd`` from the DS18B20 script and a fake ``/sys/bus/w1/devices/28-*/w1_slave`` with the
range the script declares. The run must be exact, its transcript the simulator's trial bit for bit,
and node 5's x's bit-identical to what the x86 simulator computes for it.

A second test installs a continuous plan's bundle (``deploy plan --every``, docs/continuous.md): the
unit gets its ``Restart=always`` drop-in, and the arm64 node runs 3 epochs with 5 x86 nodes under the
plan's ACL, its sensor reading changed before each epoch; every node's results file holds each
epoch's exact maximum.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adversary.transcript import Transcript
from nlagg_node.config import RunConfig
from nlagg_node.deploy import write_plan
from nlagg_node.deploy.bundle import write_bundle
from nlagg_node.deploy.nodefile import ValueSource, load_node_file, node_file_text
from nlagg_node.deploy.sensors import declared_range
from nlagg_node.valuechecks import check_node_value
from tests.harness.arm64 import (
    CACHE,
    INSTALLER,
    SOURCE_IN_ROOT,
    PiRoot,
    base_rootfs,
    copy_source,
    installed_rootfs,
    timed,
    unavailable,
)
from tests.harness.load import contention, stretched
from tests.harness.mounts import die_with_parent
from tests.harness.planbed import PlanBed

pytestmark = [pytest.mark.slow, pytest.mark.mosquitto]

REPO = Path(__file__).resolve().parents[2]
# Simulator: every output the maximum (the certified stop, before t_max).
N, SEED, T_MAX, C, MU_Z = 6, 2, 400, 3.0, 4.5
PI = 5  # the arm64 node
READING = 24750  # what the fake DS18B20 reports (millidegrees): 24.75 degC, node 5's value, the maximum
X86_VALUES = [20.5, 21.25, 19.0, 22.0, 23.125]
SENSOR = "/opt/nlagg/sensors/ds18b20"
W1_DEVICE = "/sys/bus/w1/devices/28-00000a1b2c3d"
W1_SLAVE = f"72 01 4b 46 7f ff 0e 10 57 : crc=57 YES\n72 01 4b 46 7f ff 0e 10 57 t={READING}\n"
NODE_CMD = ["/opt/nlagg/venv/bin/nlagg", "deploy", "node", f"/etc/nlagg/nodes/{PI}.toml"]
STATE_DIR = f"/var/lib/nlagg/node-{PI}"  # the unit's StateDirectory=
DONE = re.compile(
    rf"node {PI}: done, output (\S+) after (\d+) iterations \((\d+) rounds/s, (\d+) messages rejected\)"
)


@pytest.fixture(scope="module")
def pi_image() -> tuple[Path, dict[str, Any]]:
    """The installed arm64 rootfs (cached) and what getting it cost."""
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    base, base_seconds = base_rootfs()
    installed, info = installed_rootfs(base)
    return installed, {"rootfs_seconds": round(base_seconds, 1), "clean_install": info}


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a running process (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _follow_cpu(bed: PlanBed, pids: dict[str, int], into: dict[str, float]) -> None:
    """Each process's CPU seconds when the run's first x is captured (``NAME_start``: start-up,
    imports, z^(0)) and the latest before it exits (``NAME``), sampled until every one has exited."""
    started = False
    while True:
        alive = False
        if not started and bed.current_t() >= 1:
            started = True
            into.update({f"{name}_start": into.get(name, 0.0) for name in pids})
        for name, pid in pids.items():
            seconds = _cpu_seconds(pid)
            if seconds is not None:
                into[name] = round(seconds, 2)
                alive = True
        if not alive:
            return
        await asyncio.sleep(0.2)


def _bundle_for_the_pi(bed: PlanBed, workdir: Path, dest: Path) -> None:
    """Node PI's bundle, from the very plan the bed runs, with the DS18B20 as its value source."""
    plan_dir = workdir / "pi-plan"
    write_plan(bed.plan, plan_dir)  # the same users and passwords as the bed's copy
    node_file = plan_dir / "nodes" / f"{PI}.toml"
    node = load_node_file(node_file)
    node_file.write_text(
        node_file_text(node.model_copy(update={"value": ValueSource(source="command", command=SENSOR)}))
    )
    (plan_dir / "values" / f"{PI}.txt").unlink()
    write_bundle(plan_dir, PI, dest)


def _install_on_the_pi(pi: PiRoot, report: dict[str, Any]) -> None:
    """install.sh with the bundle (updates the cached install to this checkout), then again: a no-op."""
    pi.remove(f"/{SOURCE_IN_ROOT}")
    copy_source(pi.path("/"))  # this checkout, as the walk-through's git clone
    argv = ["bash", INSTALLER, "--bundle", f"/home/pi/node{PI}.tar.gz", "--enable"]
    with timed(report, "install_seconds"):
        first = pi.run(argv, timeout=1200)
    assert f"enabled nlagg-node@{PI}" in first, first
    with timed(report, "reinstall_seconds"):
        second = pi.run(argv, timeout=600)
    assert "up to date" in second, second
    assert "installed " not in second, f"a second run changed files: {second}"
    assert f"nlagg-node@{PI} already enabled" in second, second
    wants = pi.path(f"/etc/systemd/system/multi-user.target.wants/nlagg-node@{PI}.service")
    assert wants.is_symlink()
    # The unit as the Pi's systemd reads it: syntax, the ExecStart binary, User=, StateDirectory=.
    verify = pi.run(["systemd-analyze", "verify", f"/etc/systemd/system/nlagg-node@{PI}.service"])
    assert "nlagg-node" not in verify, verify  # it names the unit with every problem it finds
    unit = pi.path("/etc/systemd/system/nlagg-node@.service").read_text()
    assert "StateDirectory=nlagg/node-%i" in unit
    assert pi.run(["stat", "-c", "%U:%G %a", "/etc/nlagg"]).strip() == "root:nlagg 750"


@pytest.mark.timeout(3000)  # cold: rootfs build and a clean install under emulation, then the run
async def test_arm64_node_joins_an_x86_network_bit_for_bit(
    pi_image: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    installed, report = pi_image
    started = time.monotonic()
    value_range = declared_range(REPO / "deploy" / "pi" / "sensors" / "ds18b20")
    assert value_range == (-55.0, 125.0)
    values_file = tmp_path / "values.txt"
    values_file.write_text(" ".join(map(str, [*X86_VALUES, READING / 1000])) + "\n")
    cfg = RunConfig(
        op="max",
        n=N,
        graph="rgg",
        trials=1,
        t_max=T_MAX,
        c=C,
        mu_z=MU_Z,
        seed=SEED,
        value_range=value_range,
        values_file=values_file,
    )
    check_node_value(cfg, READING / 1000)  # what node 5 checks before it publishes anything
    bed = PlanBed(cfg, tmp_path / "bed", run_id="pi", corrupt="0")
    cpu: dict[str, float] = {}
    arm: asyncio.subprocess.Process | None = None
    with PiRoot(installed, tmp_path / "pi", bind_sys=False) as pi:
        _bundle_for_the_pi(bed, tmp_path, pi.path(f"/home/pi/node{PI}.tar.gz"))
        await asyncio.to_thread(_install_on_the_pi, pi, report)
        print(f"pi test: install.sh {report['install_seconds']} s, again {report['reinstall_seconds']} s")
        # A fake 1-wire bus where the script looks by default (the rootfs's /sys is not the host's).
        slave = pi.path(f"{W1_DEVICE}/w1_slave")
        slave.parent.mkdir(parents=True)
        slave.write_text(W1_SLAVE)
        assert pi.run([SENSOR]) == f"{READING / 1000:.3f}\n"
        async with bed:
            try:
                with (bed.logs / f"node{PI}-arm64.log").open("wb") as log:
                    arm = await asyncio.create_subprocess_exec(
                        *pi.argv([*NODE_CMD, "--state-dir", STATE_DIR], cwd="/etc/nlagg"),
                        stdout=asyncio.subprocess.PIPE,
                        stderr=log,
                        preexec_fn=die_with_parent,  # an interrupted test leaves no emulated node behind
                    )
                launched = time.monotonic()
                await bed.start_nodes(skip=frozenset({PI}))
                follow = asyncio.create_task(
                    _follow_cpu(bed, {"arm64": arm.pid, "x86": bed.nodes[0].pid}, cpu)
                )
                results, detail, arm_text = await _finish(bed, arm)
                report["arm64_node_wall_seconds"] = round(time.monotonic() - launched, 1)
                await follow
            finally:
                if arm is not None and arm.returncode is None:
                    arm.kill()
                    await arm.wait()
    outputs = {i: result["output"] for i, result in results.items()}
    verdict = bed.verdict(results, detail)
    assert verdict.completed, (verdict.detail, arm_text[-2000:], bed.report())
    truth = READING / 1000
    for i, out in outputs.items():
        assert abs(out[0] - truth) <= 1e-9 * (value_range[1] - value_range[0]), (i, out, truth)
    assert verdict.identical, verdict.detail  # outputs, every x and z^(0) bit-equal to the simulator
    assert (verdict.lost, verdict.extra, verdict.rejected_by_eavesdropper) == (0, 0, 0)
    assert verdict.rejected_by_nodes == 0
    from nlagg_node.sim import simulate

    sim = simulate(cfg.model_copy(update={"record": "all"}))
    ran = int(sim.phase_iterations[0].sum())  # max's certified stop, at the simulator's iteration
    assert results[PI]["iterations"] == ran
    with Transcript(bed.db) as tr:
        x = tr.x(N, bed.t_total)
    # The arm64 node's own x's, every one, against what x86 computes for it from the same inputs.
    assert np.array_equal(x[PI][:ran], sim.recorded_x[:ran, 0, PI]), f"node {PI}'s x's differ from x86's"
    report.update(
        {
            "x86_rounds_per_second": round(float(results[0]["rounds_per_second"]), 1),
            "x86_node_seconds": round(float(results[0]["seconds"]), 1),
            "arm64_reported_rounds_per_second": results[PI]["rounds_per_second"],
            "cpu_seconds": cpu,
            # CPU per round once running (the run is lockstep: the rate is the slowest node's).
            "cpu_ms_per_round": {
                name: round(1000 * (cpu[name] - cpu.get(f"{name}_start", 0.0)) / ran, 2)
                for name in ("arm64", "x86")
            },
            "test_seconds": round(time.monotonic() - started, 1),
        }
    )
    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE / "pi-emulated-last.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


async def _finish(
    bed: PlanBed, arm: asyncio.subprocess.Process, within: float = 900.0
) -> tuple[dict[int, dict[str, Any]], list[str], str]:
    """Wait for every node and the eavesdropper: each node's result, what went wrong, node PI's stdout.

    Node PI runs as its unit runs it (``nlagg deploy node``, no ``--json``): its result is read from
    the line it prints when done (the output is Python's repr, so exact).
    """
    results: dict[int, dict[str, Any]] = {}
    detail: list[str] = []
    arm_text = ""
    try:
        async with asyncio.timeout(within):
            arm_out, _ = await arm.communicate()
            arm_text = arm_out.decode()
            found = DONE.search(arm_text)
            if arm.returncode != 0 or found is None:
                detail.append(f"arm64 node {PI} exited with {arm.returncode}: {arm_text[-500:]}")
                return results, detail, arm_text  # its neighbours would only wait for it
            results[PI] = {"output": [float(found[1])], "iterations": int(found[2])}
            results[PI]["rounds_per_second"] = int(found[3])
            results[PI]["rejected"] = int(found[4])
            for i, proc in bed.nodes.items():
                out, _ = await proc.communicate()
                if proc.returncode != 0:
                    detail.append(f"node {i} exited with {proc.returncode}")
                    continue
                results[i] = json.loads(out.decode().strip().splitlines()[-1])
            await bed.wait_eavesdropper(detail)
    except TimeoutError:
        detail.append(f"not finished within {within:g} s")
    return results, detail, arm_text


EPOCH_READINGS = [24750, 26500, 25500]  # the DS18B20 each epoch: the maximum, 1.6 or more above x86
EVERY = 20.0  # seconds between epochs: an emulated arm64 node needs a few per epoch


def _continuous_bundle(workdir: Path, values_file: Path, dest: Path, every: float) -> Path:
    """A continuous plan (3 epochs, ``every`` s apart) of N nodes; node PI's bundle reads the DS18B20."""
    from nlagg_node.deploy import PlanSpec, build_plan
    from nlagg_node.deploy.continuous import EpochTimetable

    run = RunConfig(
        op="max",
        n=N,
        graph="rgg",
        c=C,
        mu_z=MU_Z,
        t_max=T_MAX,
        seed=SEED,
        may_depart=True,
        value_range=(-55.0, 125.0),
        values_file=values_file,
    )
    root = workdir / "continuous-plan"
    schedule = EpochTimetable(every, time.time() + 3600.0, len(EPOCH_READINGS))  # the origin is set later
    write_plan(build_plan(PlanSpec(run=run, run_id="pi-epochs", seed=SEED, schedule=schedule)), root)
    node_file = root / "nodes" / f"{PI}.toml"
    node = load_node_file(node_file)
    node_file.write_text(
        node_file_text(node.model_copy(update={"value": ValueSource(source="command", command=SENSOR)}))
    )
    (root / "values" / f"{PI}.txt").unlink()
    write_bundle(root, PI, dest)
    return root


def _set_origin(node_files: list[Path], origin: float) -> None:
    """Every node's schedule starts at ``origin`` (after the install, whose time varies)."""
    for path in node_files:
        node = load_node_file(path)
        path.write_text(node_file_text(node.model_copy(update={"origin": origin})))


@pytest.mark.timeout(3000)
async def test_arm64_node_runs_three_epochs_of_a_continuous_plan(
    pi_image: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """A continuous plan (``--every``): the Pi's unit gets ``Restart=always``, and the arm64 node runs
    3 epochs with the x86 nodes under the plan's ACL, reading its sensor again each epoch."""
    from nlagg_node.deploy import security_lines
    from nlagg_node.lab.children import Child, log_tail
    from nlagg_node.runtime.brokers import start_mosquitto
    from nlagg_node.runtime.outputs import read_outputs

    installed, report = pi_image
    values_file = tmp_path / "values.txt"
    values_file.write_text(" ".join(map(str, [*X86_VALUES, 0.0])) + "\n")  # node PI reads its sensor
    entry = [sys.executable, "-c", "from nlagg_node.cli import main; main()"]
    with PiRoot(installed, tmp_path / "pi", bind_sys=False) as pi:
        load = contention()  # a busy machine gets longer epochs, not skipped ones
        every = stretched(EVERY, load)
        root = _continuous_bundle(tmp_path, values_file, pi.path(f"/home/pi/node{PI}.tar.gz"), every)
        await asyncio.to_thread(_install_on_the_pi, pi, report)
        dropin = pi.path(f"/etc/systemd/system/nlagg-node@{PI}.service.d/continuous.conf").read_text()
        assert "Restart=always" in dropin
        slave = pi.path(f"{W1_DEVICE}/w1_slave")
        slave.parent.mkdir(parents=True)
        origin = time.time() + stretched(45.0, load)  # Python starts slowly under emulation
        node_files = [root / "nodes" / f"{i}.toml" for i in range(N) if i != PI]
        _set_origin([*node_files, pi.path(f"/etc/nlagg/nodes/{PI}.toml")], origin)
        lines = security_lines(str(root / "broker" / "passwd"), str(root / "broker" / "acl"))
        async with start_mosquitto(extra_lines=[*lines, "user root"], allow_anonymous=False) as broker:
            slave.write_text(W1_SLAVE)
            arm = await asyncio.create_subprocess_exec(
                *pi.argv([*NODE_CMD, "--broker", broker.url, "--state-dir", STATE_DIR], cwd="/etc/nlagg"),
                stdout=asyncio.subprocess.PIPE,
                stderr=(tmp_path / "arm64.log").open("wb"),
                preexec_fn=die_with_parent,  # an interrupted test leaves no emulated node behind
            )
            x86: list[Child] = []
            try:
                for path in node_files:
                    x86.append(
                        await Child.start(
                            [*entry, "deploy", "node", str(path), "--broker", broker.url],
                            log=tmp_path / f"{path.stem}.log",
                        )
                    )
                for k, reading in enumerate(EPOCH_READINGS):  # the sensor changes half a period before each
                    await asyncio.sleep(max(0.0, origin + k * every - every / 2 - time.time()))
                    slave.write_text(W1_SLAVE.replace(f"t={READING}", f"t={reading}"))
                async with asyncio.timeout(900):
                    arm_out, _ = await arm.communicate()
                    codes = [await p.wait() for p in x86]
            finally:  # a failed or interrupted run stops every node it started
                if arm.returncode is None:
                    arm.kill()
                    await arm.wait()
                for child in x86:
                    if child.returncode is None:
                        await child.kill()
        arm_text = arm_out.decode()
        assert arm.returncode == 0, (arm_text[-2000:], log_tail(tmp_path / "arm64.log"))
        series = {PI: read_outputs(pi.path(f"{STATE_DIR}/results-{PI}.jsonl"))}
    assert codes == [0] * (N - 1), [log_tail(tmp_path / f"{path.stem}.log") for path in node_files]
    assert [f"node {PI}: epoch {k}: output" in arm_text for k in range(3)] == [True] * 3, arm_text
    series |= {i: read_outputs(root / "state" / f"results-{i}.jsonl") for i in range(N) if i != PI}
    truths = [max(*X86_VALUES, r / 1000) for r in EPOCH_READINGS]  # the sensor read again each epoch
    for i, records in series.items():
        assert [r.epoch for r in records] == [0, 1, 2], (i, records)
        for r, truth in zip(records, truths, strict=True):
            assert r.output == pytest.approx(truth, abs=1e-9 * 180), (i, r, truth)
