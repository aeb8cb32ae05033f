"""deploy/pi: the sensor scripts, the systemd unit and (slow, root) the installer with a node bundle."""

from __future__ import annotations

import configparser
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from nlagg_node.config import load_config
from nlagg_node.deploy import PlanSpec, ValueSource, build_plan, write_plan
from nlagg_node.deploy.bundle import write_bundle
from nlagg_node.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
PI = REPO / "deploy" / "pi"
SENSOR_CMD = "/opt/nlagg/sensors/soc-temperature"


@pytest.fixture
def plan(tmp_path: Path) -> Path:
    run = load_config(None, op="max", n=4, graph="ring")
    out = tmp_path / "plan"
    spec = PlanSpec(
        run=run, run_id="pi", seed=1, value_source=ValueSource(source="command", command=SENSOR_CMD)
    )
    write_plan(build_plan(spec), out)
    return out


def test_soc_temperature_prints_degrees(tmp_path: Path) -> None:
    zone = tmp_path / "temp"
    zone.write_text("48312\n")
    env = {**os.environ, "NLAGG_THERMAL_ZONE": str(zone)}
    out = subprocess.run([str(PI / "sensors" / "soc-temperature")], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "48.312\n"


@pytest.mark.parametrize(
    ("reading", "expected"),
    [("t=23125", "23.125\n"), ("t=-1125", "-1.125\n")],
    ids=["positive", "negative"],
)
def test_ds18b20_parses_and_checks_crc(tmp_path: Path, reading: str, expected: str) -> None:
    dev = tmp_path / "28-0000"
    dev.mkdir()
    slave = dev / "w1_slave"
    env = {**os.environ, "NLAGG_W1_DEVICE": str(dev)}
    slave.write_text(f"72 01 4b 46 7f ff 0e 10 57 : crc=57 YES\n72 01 4b 46 7f ff 0e 10 57 {reading}\n")
    ok = subprocess.run([str(PI / "sensors" / "ds18b20")], env=env, capture_output=True, text=True)
    assert ok.stdout == expected
    slave.write_text(f"72 01 4b 46 7f ff 0e 10 57 : crc=57 NO\n72 01 4b 46 7f ff 0e 10 57 {reading}\n")
    bad = subprocess.run([str(PI / "sensors" / "ds18b20")], env=env, capture_output=True, text=True)
    assert bad.returncode != 0
    assert bad.stdout == ""


def test_unit_template_runs_the_instance_node_file() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(PI / "nlagg-node@.service")
    service = unit["Service"]
    assert service["ExecStart"] == (
        "/opt/nlagg/venv/bin/nlagg deploy node /etc/nlagg/nodes/%i.toml --state-dir %S/nlagg/node-%i"
    )
    assert service["StateDirectory"] == "nlagg/node-%i"  # writable under ProtectSystem=strict
    assert service["User"] == "nlagg"
    assert service["Restart"] == "on-failure"
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_bundle_holds_only_that_nodes_files(plan: Path, tmp_path: Path) -> None:
    out = tmp_path / "node2.tar.gz"
    members = write_bundle(plan, 2, out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600  # it holds a password and a signing key
    private = ["nodes/2.toml", "secrets/node2.pw", "secrets/node2.identity.pem"]
    assert members == ["run.toml", "graph.json", *private]
    with tarfile.open(out) as tar:
        modes = {m.name: stat.S_IMODE(m.mode) for m in tar.getmembers()}
    assert modes == {"run.toml": 0o644, "graph.json": 0o644} | dict.fromkeys(private, 0o600)
    with pytest.raises(ConfigError, match="node=9"):
        write_bundle(plan, 9, out)
    with pytest.raises(ConfigError, match=r"out='.*': cannot write it \(Is a directory\)"):
        write_bundle(plan, 2, tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("tar") is None, reason="the installer needs root and tar"
)
def test_installer_sets_up_a_runnable_node(plan: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "node1.tar.gz"
    write_bundle(plan, 1, bundle)
    prefix, etc = tmp_path / "opt", tmp_path / "etc"
    argv = [
        "bash",
        str(PI / "install.sh"),
        "--no-systemd",
        "--system-site-packages",
        "--user",
        "root",
        "--prefix",
        str(prefix),
        "--etc",
        str(etc),
        "--bundle",
        str(bundle),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0 and "No matching distribution" in done.stderr + done.stdout:
        pytest.skip("pip could not reach a package index for the build backend")
    assert done.returncode == 0, done.stderr[-3000:]
    again = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "up to date" in again.stdout, again.stdout  # pip is not run again
    assert "installed " not in again.stdout, again.stdout  # and no file is rewritten
    assert os.access(prefix / "sensors" / "soc-temperature", os.X_OK)
    for path in etc.rglob("*"):
        assert stat.S_IMODE(path.stat().st_mode) & 0o007 == 0, path  # nothing for others
    dry = subprocess.run(
        [
            str(prefix / "venv" / "bin" / "nlagg"),
            "deploy",
            "node",
            str(etc / "nodes" / "1.toml"),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith(f"cd {etc.resolve()} && nlagg node --id 1 --config run.toml --value-cmd ")
    assert SENSOR_CMD in dry.stdout
    assert "--password-file secrets/node1.pw" in dry.stdout
