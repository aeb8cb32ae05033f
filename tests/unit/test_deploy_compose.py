"""`nlagg deploy compose`: the compose project it writes, the committed example, the image recipe.

The project is run for real (images built, containers started) by tests/integration/test_compose_testbed.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from nlagg_node.cli import main
from nlagg_node.config import load_config
from nlagg_node.deploy import PlanSpec, build_plan, compose_yaml, load_plan, service_names, write_plan

REPO = Path(__file__).resolve().parents[2]
# The committed docker-compose.yml is what this writes (deploy/README.md, "Run the compose testbed").
EXAMPLE_ARGS = ["--plan-dir", "deploy/testbed", "--corrupt-count", "2"]


def run_cli(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str]:
    monkeypatch.setattr("sys.argv", ["nlagg", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out + err


def _services(text: str) -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(text)  # resolves the x-nlagg anchors and their merges
    return dict(doc["services"])


def _mounts(service: dict[str, Any]) -> set[str]:
    return set(service.get("volumes", []))


def test_each_service_mounts_only_the_files_it_needs(tmp_path: Path) -> None:
    run = load_config(None, op="max", n=4, graph="ring")
    plan_dir = tmp_path / "plan"
    write_plan(build_plan(PlanSpec(run=run, run_id="r1", seed=7, corrupt="0")), plan_dir)
    plan = load_plan(plan_dir)
    services = _services(compose_yaml(plan, compose_dir=tmp_path))
    assert list(services) == service_names(plan)
    for i in range(4):
        node = services[f"node-{i}"]
        files = ["run.toml", "graph.json", f"nodes/{i}.toml", f"secrets/node{i}.pw", f"values/{i}.txt"]
        files.append(f"secrets/node{i}.identity.pem")
        assert _mounts(node) == {f"./plan/{f}:/plan/{f}:ro" for f in files} | {f"state-{i}:/state"}
        assert node["command"][-2:] == ["--state-dir", "/state"]
        assert node["depends_on"]["eavesdropper"] == {"condition": "service_healthy"}
        assert node["user"] == "${NLAGG_UID:-10001}:${NLAGG_GID:-10001}"
    eaves = "secrets/eavesdropper.pw"
    assert _mounts(services["eavesdropper"]) == {f"./plan/{eaves}:/plan/{eaves}:ro", "transcript:/transcript"}
    assert _mounts(services["broker"]) == {"./plan/broker:/plan/broker:ro", "broker-data:/mosquitto/data"}
    assert services["broker"]["image"] == "${NLAGG_BROKER_IMAGE:-eclipse-mosquitto:2.0}"
    assert all("secrets/node" not in m for m in _mounts(services["launcher"]))


def test_a_scheduled_plans_eavesdropper_captures_every_epoch_with_derived_configs(tmp_path: Path) -> None:
    from nlagg_node.deploy.continuous import EpochTimetable

    run = load_config(None, op="median", n=4, graph="ring", value_range=(0.0, 10.0))
    schedule = EpochTimetable(60.0, 1.9e9, 3, drift=0.01)
    write_plan(build_plan(PlanSpec(run=run, run_id="r1", seed=7, schedule=schedule)), tmp_path / "plan")
    eaves = _services(compose_yaml(load_plan(tmp_path / "plan"), compose_dir=tmp_path))["eavesdropper"]
    argv = eaves["command"]
    assert "--continuous" in argv
    assert argv[argv.index("--transcript") + 1] == "/transcript/epochs"
    assert argv[argv.index("--config") + 1] == "run.toml"
    assert float(argv[argv.index("--drift") + 1]) == 0.01
    assert "./plan/run.toml:/plan/run.toml:ro" in _mounts(eaves)
    assert eaves["restart"] == "unless-stopped"


def test_deploy_compose_writes_a_fresh_gitignored_project(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["deploy", "compose", "--n", "4", "--graph", "ring", "--corrupt", "0", "--run-id", "lab"]
    code, text = run_cli([*args, "--out", str(tmp_path / "a")], capsys, monkeypatch)
    assert code == 0, text
    code, text = run_cli([*args, "--out", str(tmp_path / "b")], capsys, monkeypatch)
    assert code == 0, text
    a, b = tmp_path / "a", tmp_path / "b"
    assert (a / "docker-compose.yml").read_text() == compose_yaml(load_plan(a / "plan"), compose_dir=a)
    assert (a / "docker-compose.yml").read_text() == (b / "docker-compose.yml").read_text()
    # Fresh secrets every time, and a plan directory that ignores itself in git.
    assert (a / "plan/secrets/node0.pw").read_text() != (b / "plan/secrets/node0.pw").read_text()
    assert "\n*\n" in (a / "plan" / ".gitignore").read_text()
    assert load_plan(a / "plan").broker == "mqtt://broker:1883"
    env = dict(line.split("=", 1) for line in (a / ".env").read_text().splitlines() if "=" in line)
    owner = (a / "plan/secrets/node0.pw").stat()
    assert (int(env["NLAGG_UID"]), int(env["NLAGG_GID"])) == (owner.st_uid, owner.st_gid)
    # Every plan file an nlagg service mounts is readable by the user it runs as (the launcher's
    # signing key included: without it the config is never published and no node starts).
    services = _services((a / "docker-compose.yml").read_text())
    mounted = {
        m.split(":")[0].removeprefix("./")
        for name, service in services.items()
        if name != "broker"
        for m in _mounts(service)
        if m.startswith("./plan/")
    }
    assert "plan/secrets/launcher.identity.pem" in mounted
    assert {f: (a / f).stat().st_uid for f in mounted} == dict.fromkeys(mounted, owner.st_uid)
    code, text = run_cli([*args, "--out", str(a)], capsys, monkeypatch)
    assert code == 2
    assert "--force" in text


def test_committed_compose_file_is_what_deploy_compose_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, text = run_cli(["deploy", "compose", "--out", str(tmp_path), *EXAMPLE_ARGS], capsys, monkeypatch)
    assert code == 0, text
    assert (REPO / "docker-compose.yml").read_text() == (tmp_path / "docker-compose.yml").read_text()


def test_image_recipe_is_offline_non_root_and_holds_no_plan() -> None:
    lines = (REPO / "Dockerfile").read_text().splitlines()
    assert "ARG BASE=python:3.11-slim" in lines
    assert lines.count("FROM ${BASE} AS base") == 1
    copied = {line.split()[1] for line in lines if line.startswith("COPY ") and "--from" not in line}
    assert copied == {"ca/", "wheels/", "app/"}  # what scripts/image puts in the build context
    installs = [line for line in lines if "pip install" in line]
    assert installs
    assert all("--no-index" in line for line in installs)
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users
    assert users[-1].split(":")[0] not in ("0", "root")
    assert any(line.strip().startswith("NUMBA_CACHE_DIR=/tmp/") for line in lines)
    assert not any(line.startswith("# syntax=") for line in lines)  # BuildKit would need a registry


def test_deploy_truth_writes_the_plans_values_privately(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from nlagg_node.deploy.nodefile import read_node_value

    run = load_config(None, op="max", n=4, graph="ring")
    write_plan(build_plan(PlanSpec(run=run, run_id="r1", seed=7, corrupt="0")), tmp_path / "plan")
    out = tmp_path / "summary.json"
    code, text = run_cli(
        ["deploy", "truth", "--plan", str(tmp_path / "plan"), "--out", str(out)], capsys, monkeypatch
    )
    assert code == 0, text
    doc = json.loads(out.read_text())
    plan = load_plan(tmp_path / "plan")
    assert doc == {
        "run_id": "r1",
        "corrupted": [0],
        "private_values": {str(n.id): read_node_value(n, tmp_path / "plan") for n in plan.nodes},
    }
    assert out.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("client_certificates", [False, True], ids=["ca", "client-certificates"])
def test_a_tls_testbed_listens_with_tls_and_every_client_dials_with_the_ca(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    client_certificates: bool,
) -> None:
    args = ["deploy", "compose", "--n", "3", "--graph", "ring", "--tls", "--out", str(tmp_path)]
    code, text = run_cli([*args, *(["--require-certificate"] * client_certificates)], capsys, monkeypatch)
    assert code == 0, text
    plan = load_plan(tmp_path / "plan")
    services = _services((tmp_path / "docker-compose.yml").read_text())
    conf = (tmp_path / "plan/broker/mosquitto-docker.conf").read_text().splitlines()
    assert {"listener 8883", "certfile /mosquitto/config/tls/server.pem", "tls_version tlsv1.2"} <= set(conf)
    assert ("require_certificate true" in conf) == client_certificates
    server = x509.load_pem_x509_certificate((tmp_path / "plan/broker/tls/server.pem").read_bytes())
    server.verify_directly_issued_by(
        x509.load_pem_x509_certificate((tmp_path / "plan/tls/ca.pem").read_bytes())
    )
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "broker" in names.get_values_for_type(x509.DNSName)  # the host every client dials
    for name in service_names(plan)[1:]:
        user = name.replace("-", "")
        command, mounts = services[name]["command"], _mounts(services[name])
        assert command[command.index("--broker") + 1] == "mqtts://broker:8883"
        files = ["tls/ca.pem"] + [f"secrets/{user}.{ext}" for ext in ("crt", "key")] * client_certificates
        assert {f"./plan/{f}:/plan/{f}:ro" for f in files} <= mounts
        if not name.startswith("node-"):  # a node reads its TLS files from its node file
            assert command[command.index("--ca-file") + 1] == "tls/ca.pem"
            assert ("--cert-file" in command) == client_certificates
    code, text = run_cli(
        ["deploy", "compose", "--plan", str(tmp_path / "plan"), "--tls"], capsys, monkeypatch
    )
    assert code == 2
    assert "tls=True" in text
