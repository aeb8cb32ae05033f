"""``nlagg deploy plan --every``: the schedule in every node file, an ACL for every epoch, services that
restart (the ACL enforced on a real Mosquitto: tests/integration/test_epochs_mosquitto.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nlagg_node.cli import main
from nlagg_node.config import load_config
from nlagg_node.deploy import PlanSpec, build_plan, compose_yaml, load_plan, write_plan
from nlagg_node.deploy.continuous import EpochTimetable, schedule_of
from nlagg_node.deploy.nodefile import load_node_file, node_file_argv
from nlagg_node.errors import ConfigError

SCHEDULE = EpochTimetable(every=300.0, origin=1_800_000_000.0, epochs=12, drift=0.01)


@pytest.fixture
def plan_dir(tmp_path: Path) -> Path:
    run = load_config(None, op="max", n=4, graph="ring")
    out = tmp_path / "plan"
    write_plan(build_plan(PlanSpec(run=run, run_id="gh", seed=7, corrupt="0", schedule=SCHEDULE)), out)
    return out


def test_node_files_carry_the_schedule(plan_dir: Path) -> None:
    node = load_node_file(plan_dir / "nodes" / "2.toml")
    assert (node.every, node.epochs, node.origin) == (300.0, 12, 1_800_000_000.0)
    argv = node_file_argv(node)
    assert argv[argv.index("--every") + 1] == "300.0"
    assert argv[argv.index("--origin") + 1] == "1800000000.0"
    assert "every = 300.0" in (plan_dir / "plan.toml").read_text()
    assert argv[argv.index("--drift") + 1] == "0.01"  # warm starts' declared drift
    assert "--cold-start" not in argv


def test_commands_tell_the_eavesdropper_to_capture_every_epoch(plan_dir: Path) -> None:
    lines = (plan_dir / "commands.txt").read_text().splitlines()
    (eaves,) = [line for line in lines if line.startswith("nlagg eavesdrop")]
    assert "--continuous" in eaves.split()
    assert eaves.split()[eaves.split().index("--transcript") + 1] == "epochs"


def test_the_acl_covers_every_epoch_and_the_results(plan_dir: Path) -> None:
    acl = (plan_dir / "broker" / "acl").read_text()
    node1 = acl.split("user node1\n")[1].split("\n\n")[0].splitlines()
    assert "topic write nlagg/gh/+/node/1/x" in node1
    assert "topic read nlagg/gh/+/edge/0/1/z0" in node1  # ring: 0 and 2 are its neighbours
    assert "topic write nlagg/gh/results/1" in node1
    assert "topic read nlagg/gh/results/+" in node1  # the outputs a node warm-starts from after a miss
    assert not [line for line in node1 if "/gh/edge/" in line]  # no single-run grant
    shared = [line for line in node1 if "/gh/node/" in line]  # status and key: the topics every epoch shares
    assert shared == [
        "topic write nlagg/gh/node/1/status",
        "topic write nlagg/gh/node/1/key",
        *(f"topic read nlagg/gh/node/{j}/{leaf}" for j in (0, 2) for leaf in ("status", "key")),
    ]
    assert not [
        line for line in acl.splitlines() if "/+/node/" in line and line.endswith(("/status", "/key"))
    ]
    assert "user launcher\ntopic read nlagg/gh/results/+\ntopic readwrite nlagg/gh/config\n" in acl
    assert "user eavesdropper\ntopic read nlagg/gh/#\n" in acl
    assert "topic write nlagg/gh/+/adv/0/state" in acl  # the corrupted node, in every epoch


def test_compose_node_services_restart(plan_dir: Path, tmp_path: Path) -> None:
    services = yaml.safe_load(compose_yaml(load_plan(plan_dir), compose_dir=tmp_path))["services"]
    assert [services[f"node-{i}"]["restart"] for i in range(4)] == ["unless-stopped"] * 4
    assert services["launcher"]["restart"] == "on-failure"


@pytest.mark.parametrize(
    ("every", "epochs", "origin", "field"),
    [(None, 3, None, "epochs"), (None, None, 5.0, "origin"), (0.0, None, None, "every")],
    ids=["epochs-alone", "origin-alone", "zero-period"],
)
def test_schedule_options_refused_with_the_option(
    every: float | None, epochs: int | None, origin: float | None, field: str
) -> None:
    with pytest.raises(ConfigError, match=f"^{field}="):
        schedule_of(every, epochs, origin)


def test_default_origin_is_a_whole_minute_ahead() -> None:
    schedule = schedule_of(60.0, None, None)
    assert schedule is not None
    assert schedule.origin % 60 == 0


@pytest.mark.parametrize(
    ("extra", "drift", "cold"),
    [
        (["--value-range", "0", "40"], 0.01, False),
        (["--value-range", "0", "40", "--drift", "0.05"], 0.05, False),
        (["--value-range", "0", "40", "--cold-start"], None, True),
        ([], None, False),
    ],
    ids=["range-default", "declared", "cold-start", "no-range"],
)
def test_a_continuous_plan_warm_starts_by_default_where_the_range_gives_the_drift_a_scale(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    drift: float | None,
    cold: bool,
) -> None:
    out = tmp_path / "plan"
    argv = ["nlagg", "deploy", "plan", "--out", str(out), "--run-id", "gh", "--n", "4", "--every", "300"]
    monkeypatch.setattr("sys.argv", [*argv, *extra])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code in (0, None), capsys.readouterr()
    node = load_node_file(out / "nodes" / "0.toml")
    assert (node.drift, node.cold_start) == (drift, cold)
    (eaves,) = [
        ln for ln in (out / "commands.txt").read_text().splitlines() if ln.startswith("nlagg eavesdrop")
    ]
    assert ("--drift" in eaves.split()) == (drift is not None)  # the capture derives the same epochs
