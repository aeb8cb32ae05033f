"""`nlagg deploy plan` / `compose`: file contents, ACL derived from the graph, compose services."""

from __future__ import annotations

import json
import shlex
import stat
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nlagg_node.cli import _register, app, main
from nlagg_node.config import load_config
from nlagg_node.deploy import (
    PlanSpec,
    ValueSource,
    build_plan,
    load_node_file,
    load_plan,
    parse_corrupt,
    verify_password,
    write_plan,
)
from nlagg_node.deploy.nodefile import read_node_value
from nlagg_node.errors import ConfigError


def run_cli(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str]:
    """Run ``nlagg ARGS`` through the console entry point (errors -> exit 2); return code and output."""
    monkeypatch.setattr("sys.argv", ["nlagg", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out + err


def _make_plan(tmp_path: Path, **spec_kw: object) -> Path:
    run = load_config(None, op="max", n=spec_kw.pop("n", 6), graph=spec_kw.pop("graph", "rgg"))
    spec = PlanSpec(run=run, run_id="r1", seed=7, **spec_kw)  # type: ignore[arg-type]
    out = tmp_path / "plan"
    write_plan(build_plan(spec), out)
    return out


def parse_acl(text: str) -> dict[str, set[tuple[str, str]]]:
    """user -> {(access, topic)} from a Mosquitto ACL file."""
    acl: dict[str, set[tuple[str, str]]] = {}
    user = None
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        if parts[0] == "user":
            user = parts[1]
            acl[user] = set()
        else:
            assert parts[0] == "topic"
            assert user is not None, "topic line outside a user block grants every client"
            acl[user].add((parts[1], parts[2]))
    return acl


def test_plan_files_public_part_has_no_private_values_or_seed(tmp_path: Path) -> None:
    out = _make_plan(tmp_path, corrupt_count=2)
    public = (out / "run.toml").read_text() + (out / "graph.json").read_text()
    nodes = [load_node_file(out / "nodes" / f"{i}.toml") for i in range(6)]
    values = [read_node_value(node, out) for node in nodes]
    assert [node.value.path for node in nodes] == [f"values/{i}.txt" for i in range(6)]
    assert stat.S_IMODE((out / "values" / "0.txt").stat().st_mode) == 0o600
    from nlagg_node.deploy.bundle import bundle_members

    assert bundle_members(out, 1) == [
        "run.toml",
        "graph.json",
        "nodes/1.toml",
        "secrets/node1.pw",
        "secrets/node1.identity.pem",
        "values/1.txt",
    ]
    for v in values:
        assert repr(v) not in public
    doc = tomllib.loads((out / "run.toml").read_text())
    assert "seed" not in doc["run"]
    assert doc["network"] == {"prefix": "nlagg", "run_id": "r1"}
    cfg = load_config(None, **{**doc["run"], "graph_file": str(out / "graph.json")})
    graph = json.loads((out / "graph.json").read_text())
    assert cfg.graph == "file"
    assert cfg.n == graph["n"] == 6
    assert [list(e) for e in cfg.graph_spec().build(None).tolist()] == graph["edges"]  # type: ignore[arg-type]
    assert sum(node.corrupt for node in nodes) == 2


def test_plan_secrets_modes_and_password_file(tmp_path: Path) -> None:
    out = _make_plan(tmp_path)
    assert stat.S_IMODE((out / "secrets").stat().st_mode) == 0o700
    hashes = dict(line.split(":", 1) for line in (out / "broker" / "passwd").read_text().splitlines())
    users = {"launcher", "eavesdropper", *(f"node{i}" for i in range(6))}
    assert set(hashes) == users
    for user in users:
        pw_file = out / "secrets" / f"{user}.pw"
        assert stat.S_IMODE(pw_file.stat().st_mode) == 0o600
        password = pw_file.read_text().strip()
        assert hashes[user].startswith("$7$101$")
        assert verify_password(password, hashes[user])
        assert not verify_password(password + "x", hashes[user])
    for private in ("plan.toml", "nodes/0.toml", "broker/passwd", "broker/acl"):
        assert stat.S_IMODE((out / private).stat().st_mode) == 0o600, private


def test_acl_follows_the_graph(tmp_path: Path) -> None:
    out = _make_plan(tmp_path, graph="ring", corrupt="3,")
    acl = parse_acl((out / "broker" / "acl").read_text())
    root = "nlagg/r1"
    assert acl["eavesdropper"] == {("read", f"{root}/#")}
    assert acl["launcher"] == {("readwrite", f"{root}/config")}
    for i in range(6):
        nbrs = [(i - 1) % 6, (i + 1) % 6]
        writes = {f"{root}/node/{i}/x", f"{root}/node/{i}/status", f"{root}/node/{i}/key"}
        writes |= {f"{root}/edge/{i}/{j}/z0" for j in nbrs}
        if i == 3:
            writes.add(f"{root}/adv/3/state")
        reads = {f"{root}/config"}
        for j in nbrs:
            reads |= {f"{root}/node/{j}/x", f"{root}/node/{j}/status", f"{root}/node/{j}/key"}
            reads.add(f"{root}/edge/{j}/{i}/z0")
        assert {t for a, t in acl[f"node{i}"] if a == "write"} == writes
        assert {t for a, t in acl[f"node{i}"] if a == "read"} == reads
        assert all("#" not in t and "+" not in t for _, t in acl[f"node{i}"])


def test_commands_start_every_part_without_passwords(tmp_path: Path) -> None:
    out = _make_plan(tmp_path, corrupt="1,4")
    lines = [ln for ln in (out / "commands.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    argvs = [shlex.split(ln) for ln in lines]
    assert argvs[0] == ["mosquitto", "-c", "broker/mosquitto.conf"]
    assert argvs[1][:2] == ["nlagg", "eavesdrop"]
    assert argvs[2][:3] == ["nlagg", "deploy", "publish-config"]
    node_lines = [a for a in argvs if a[:2] == ["nlagg", "node"]]
    assert [int(a[a.index("--id") + 1]) for a in node_lines] == list(range(6))
    assert [("--corrupt" in a) for a in node_lines] == [i in (1, 4) for i in range(6)]
    assert all(a[a.index("--state-dir") + 1] == "state" for a in node_lines)  # a restart resumes
    passwords = [p.read_text().strip() for p in (out / "secrets").iterdir()]
    text = (out / "commands.txt").read_text()
    assert not any(pw in text for pw in passwords)
    for argv in argvs[1:]:
        assert (out / argv[argv.index("--password-file") + 1]).is_file()
    conf = (out / "broker" / "mosquitto.conf").read_text().splitlines()
    for line in (
        "allow_anonymous false",
        "per_listener_settings false",
        "set_tcp_nodelay true",
        "persistence true",
        "password_file broker/passwd",
        "acl_file broker/acl",
        "listener 1883",
        "use_username_as_clientid true",
        "message_size_limit 1048576",
        "max_packet_size 65536",  # the plan's own (its config is a few KB), not the protocol's 1114112
        "max_connections 4000",
    ):
        assert line in conf
    assert not any(line.startswith(("cafile", "certfile", "keyfile")) for line in conf)
    limits = (out / "broker" / "mosquitto-limits.conf").read_text()
    assert "LimitNOFILE=8192" in limits.splitlines()  # above max_connections 4000


@pytest.mark.parametrize(
    ("spec", "count", "expected"),
    [
        (None, None, []),
        ("none", None, []),
        ("0", None, [0]),
        ("3", None, [3]),
        ("3,7", None, [3, 7]),
        ("5,", None, [5]),
        (None, 3, [0, 1, 2]),
    ],
    ids=["none", "none-word", "node-0", "one-id", "ids", "trailing-comma", "count"],
)
def test_parse_corrupt(spec: str | None, count: int | None, expected: list[int]) -> None:
    assert parse_corrupt(spec, 10, count=count) == expected


def test_corrupt_names_the_same_nodes_in_plan_and_sim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--corrupt 0`` is node 0 and ``--corrupt-count 2`` nodes 0 and 1, in deploy plan as in sim."""
    from adversary.transcript import Transcript

    assert load_plan(_make_plan(tmp_path / "a", corrupt="0")).corrupted == [0]
    assert load_plan(_make_plan(tmp_path / "b", corrupt_count=2)).corrupted == [0, 1]
    for flags, expected in ((["--corrupt", "0"], [0]), (["--corrupt-count", "2"], [0, 1])):
        db = tmp_path / f"t{len(expected)}.sqlite"
        args = ["sim", "--n", "6", "--trials", "1", "--t-max", "50", *flags, "--transcript", str(db)]
        assert run_cli([*args, "--json"], capsys, monkeypatch)[0] == 0
        with Transcript(db) as tr:
            assert tr.corrupted() == expected


@pytest.mark.parametrize(
    ("spec", "count", "why"),
    [
        ("10", None, "node ids must lie in 0..9"),
        ("x", None, "use node ids"),
        ("3,12", None, "node ids must lie in 0..9"),
        ("0,1,2,3,4,5,6,7,8,9", None, "at least one node must stay honest"),
        (None, 0, "corrupt_count=0: must be at least 1"),
        (None, 10, "corrupt_count=10: must lie in 1..9"),
        ("1", 2, "not both"),
    ],
    ids=["id-range", "text", "range", "no-honest", "count-zero", "count-all", "both"],
)
def test_parse_corrupt_rejects(spec: str | None, count: int | None, why: str) -> None:
    with pytest.raises(ConfigError, match="corrupt") as exc:
        parse_corrupt(spec, 10, count=count)
    assert why in str(exc.value)


def test_cli_refuses_a_zero_count_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = [
        "sim",
        "--trials",
        "1",
        "--t-max",
        "10",
        "--corrupt-count",
        "0",
        "--transcript",
        str(tmp_path / "t"),
    ]
    code, text = run_cli(args, capsys, monkeypatch)
    assert code == 2
    assert text.strip().splitlines() == [
        "nlagg: error: corrupt_count=0: must be at least 1 (leave it out for no corrupted node)"
    ]


def test_plan_refuses_bad_run_id_and_overwrite(tmp_path: Path) -> None:
    run = load_config(None, n=4, graph="ring")
    with pytest.raises(ConfigError, match="run_id='a b'"):
        build_plan(PlanSpec(run=run, run_id="a b"))
    out = _make_plan(tmp_path)
    with pytest.raises(ConfigError, match="--force"):
        write_plan(build_plan(PlanSpec(run=run, run_id="r1")), out)


def test_value_sources_and_node_command(tmp_path: Path) -> None:
    cmd = "awk '{print $1/1000}' /sys/class/thermal/thermal_zone0/temp"
    out = _make_plan(tmp_path, value_source=ValueSource(source="command", command=cmd))
    _register()
    result = CliRunner().invoke(app, ["deploy", "node", str(out / "nodes" / "2.toml"), "--dry-run"])
    assert result.exit_code == 0, result.output
    cd, _, line = result.output.strip().partition(" && ")
    assert cd == f"cd {out.resolve()}"
    argv = shlex.split(line)
    assert argv[argv.index("--value-cmd") + 1] == cmd
    assert argv[argv.index("--username") + 1] == "node2"
    with pytest.raises(ValueError, match=r"value\.path=None"):
        ValueSource(source="file")


def test_cli_plan_errors_name_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["deploy", "plan", "--out", str(tmp_path / "p"), "--run-id", "r", "--n", "5", "--corrupt", "9,1"]
    code, out = run_cli(args, capsys, monkeypatch)
    assert code == 2
    assert "corrupt='9,1'" in out


def test_cli_plan_compose_and_dry_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "lab"
    args = ["deploy", "plan", "--out", str(out), "--run-id", "lab", "--n", "5", "--graph", "ring"]
    args += [
        "--corrupt-count",
        "2",
        "--seed",
        "4",
        "--listen",
        "127.0.0.1:18830",
        "--broker",
        "mqtt://10.0.0.1:18830",
    ]
    code, text = run_cli(args, capsys, monkeypatch)
    assert code == 0, text
    assert "n=5, 5 edges" in text
    assert "listener 18830 127.0.0.1" in (out / "broker" / "mosquitto.conf").read_text().splitlines()
    code, text = run_cli(args, capsys, monkeypatch)
    assert code == 2
    assert "--force" in text
    monkeypatch.chdir(tmp_path)
    code, text = run_cli(["deploy", "compose", "--plan", "lab"], capsys, monkeypatch)
    assert code == 0, text
    assert "      - ./lab/nodes/0.toml:/plan/nodes/0.toml:ro" in text
    code, text = run_cli(["deploy", "node", str(out / "nodes" / "0.toml"), "--dry-run"], capsys, monkeypatch)
    assert code == 0, text
    assert "--value-file values/0.txt --broker mqtt://10.0.0.1:18830 --username node0" in text


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--broker", "mqtts://h:8883"], "broker"),
        (["--broker", "http://h"], "broker"),
        (["--listen", "h:x"], "listen"),
        (["--tls-cafile", "ca.pem"], "tls"),
        (["--value", "1", "--value-cmd", "true"], "value_cmd"),
        (["--run-id", "bad id"], "run_id"),
    ],
    ids=["mqtts", "scheme", "port", "tls-partial", "two-sources", "run-id"],
)
def test_cli_plan_rejects_bad_options(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    extra: list[str],
    field: str,
) -> None:
    run_id = [] if "--run-id" in extra else ["--run-id", "r"]
    args = ["deploy", "plan", "--out", str(tmp_path / "p"), *run_id, "--n", "4", *extra]
    code, text = run_cli(args, capsys, monkeypatch)
    assert code == 2, text
    assert f"{field}=" in text
    assert not (tmp_path / "p").exists()


def pi_plan_args(out: Path) -> list[str]:
    """``nlagg deploy plan`` of a 4-node ring into ``out``, before its value source."""
    return [
        "deploy",
        "plan",
        "--out",
        str(out),
        "--run-id",
        "pi",
        "--n",
        "4",
        "--graph",
        "ring",
        "--seed",
        "1",
    ]


@pytest.mark.parametrize(
    ("sensor", "expected"),
    [("/opt/nlagg/sensors/ds18b20", [-55.0, 125.0]), ("/opt/nlagg/sensors/soc-temperature", [-40.0, 110.0])],
    ids=["ds18b20", "soc-temperature"],
)
def test_plan_writes_the_range_the_sensor_script_declares(
    sensor: str,
    expected: list[float],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = tmp_path / "pi"
    args = pi_plan_args(out)
    code, text = run_cli([*args, "--value-cmd", sensor], capsys, monkeypatch)
    assert code == 0, text
    run = tomllib.loads((out / "run.toml").read_text())["run"]
    assert run["value_range"] == expected
    assert load_config(out / "run.toml").value_range == tuple(expected)


def test_plan_value_range_flag_wins_over_the_sensor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "pi"
    args = pi_plan_args(out)
    args += ["--value-cmd", "/opt/nlagg/sensors/ds18b20", "--value-range", "10", "40"]
    code, text = run_cli(args, capsys, monkeypatch)
    assert code == 0, text
    assert tomllib.loads((out / "run.toml").read_text())["run"]["value_range"] == [10.0, 40.0]


def test_public_config_names_no_private_values_file(tmp_path: Path) -> None:
    values = tmp_path / "private-values.csv"
    values.write_text("21.5 22.0 20.7 24.1\n")
    run = load_config(None, op="max", n=4, graph="ring", values_file=values)
    out = tmp_path / "plan"
    write_plan(build_plan(PlanSpec(run=run, run_id="r1", seed=7)), out)
    public = (out / "run.toml").read_text()
    assert "values_file" not in tomllib.loads(public)["run"]
    assert str(values) not in public


@pytest.mark.parametrize(
    ("flags", "early_stop", "may_depart", "window", "tolerance"),
    [
        ([], True, True, 100, 1e-9),
        (["--no-early-stop"], False, True, 100, 1e-9),
        (["--no-may-depart"], True, False, 100, 1e-9),
        (["--stop-window", "250"], True, True, 250, 1e-9),
        (["--tolerance", "1e-6"], True, True, 100, 1e-6),
    ],
    ids=["departures-survived-by-default", "fixed-schedule", "no-departures", "window", "tolerance"],
)
def test_plan_stops_early_and_survives_departures_unless_told(
    flags: list[str],
    early_stop: bool,
    may_depart: bool,
    window: int,
    tolerance: float,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Unlike sim and testbed: a device in the field may leave for good, so a plan's early stop
    # survives departures by default; the nodes read the choice from the public run.toml.
    out = tmp_path / "p"
    args = ["deploy", "plan", "--out", str(out), "--run-id", "r1", "--n", "6", "--seed", "1", *flags]
    code, text = run_cli(args, capsys, monkeypatch)
    assert code == 0, text
    cfg = load_config(out / "run.toml")
    assert cfg.early_stop is early_stop
    assert cfg.may_depart is may_depart
    assert cfg.stop_window_value == window  # written in: the nodes need no operator table
    assert cfg.tolerance == tolerance
