"""`nlagg deploy compose` checked by the real tools: git holds no secrets, docker-compose accepts the
files (the project itself: tests/unit/test_deploy_compose.py; run for real by
tests/integration/test_compose_testbed.py)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

from nlagg_node.config import load_config
from nlagg_node.deploy import PlanSpec, build_plan, compose_yaml, load_plan, service_names, write_plan

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="not a git checkout")
def test_git_holds_no_secrets() -> None:
    tracked = subprocess.run(
        ["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True, check=True, timeout=60
    ).stdout.splitlines()
    assert [p for p in tracked if "secrets/" in p or "passwd" in p] == []
    assert not any(p.startswith("deploy/testbed/") for p in tracked)


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose binary not installed")
@pytest.mark.parametrize("which", ["committed", "generated", "generated-tls"])
def test_docker_compose_config_accepts_the_file(tmp_path: Path, which: str) -> None:
    if which == "committed":
        compose, cwd = REPO / "docker-compose.yml", REPO
        expected = ["broker", "eavesdropper", "launcher", *(f"node-{i}" for i in range(6))]
    else:
        run = load_config(None, op="max", n=4, graph="ring")
        spec = PlanSpec(run=run, run_id="r1", seed=7)
        if which == "generated-tls":  # the CA and client files mounted into every service
            spec = dataclasses.replace(spec, broker_url="mqtts://broker:8883", make_tls=True)
        write_plan(build_plan(spec), tmp_path / "plan")
        compose, cwd = tmp_path / "docker-compose.yml", tmp_path
        compose.write_text(compose_yaml(load_plan(tmp_path / "plan"), compose_dir=tmp_path))
        expected = service_names(load_plan(tmp_path / "plan"))
    proc = subprocess.run(
        ["docker-compose", "-f", str(compose), "config", "--services"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == sorted(expected)
