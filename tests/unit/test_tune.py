"""``nlagg tune``: the Pareto table, the choice, an unreachable target, the written run.toml."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from nlagg_node.cli import main
from nlagg_node.config import RunConfig, load_config
from nlagg_node.tune import Evaluation, Setting, choose, evaluate, ideal_ranks, pareto, run_toml, tune


def _eval(c: float, leak: float, p99: float, *, exact: bool = True, trials: int = 1000) -> Evaluation:
    from nlagg_node.tune import wilson_upper

    return Evaluation(
        setting=Setting("proposed", c, 3 * c, 1.0, 8000),
        trials=trials,
        leak=leak,
        leak_upper=wilson_upper(leak, trials),
        leak_by_rank=(1.0, leak),
        converged=1.0 if exact else 0.5,
        exact=exact,
        iterations_median=p99 / 2,
        iterations_p99=p99,
        seconds=0.0,
    )


def test_pareto_keeps_only_undominated_exact_settings() -> None:
    evals = [_eval(10, 0.10, 2000), _eval(30, 0.04, 2500), _eval(50, 0.05, 3000), _eval(100, 0.0, 6000)]
    evals.append(_eval(300, 0.0, 1000, exact=False))
    assert [e.setting.c for e in pareto(evals)] == [100, 30, 10]


def test_choice_is_the_fastest_setting_that_meets_the_target_with_confidence() -> None:
    evals = [_eval(10, 0.10, 2000), _eval(30, 0.005, 2500), _eval(100, 0.0, 6000)]
    choice, met = choose(evals, 0.02)
    assert met
    assert choice.setting.c == 30
    # 0.015 measured over 1000 trials has a 95% upper bound above 0.02: not good enough
    choice, met = choose([_eval(10, 0.015, 1000), _eval(100, 0.001, 6000)], 0.02)
    assert met
    assert choice.setting.c == 100


def test_unreachable_target_gives_the_closest_setting() -> None:
    choice, met = choose([_eval(10, 0.10, 2000), _eval(30, 0.04, 2500)], 0.001)
    assert not met
    assert choice.setting.c == 30


@pytest.mark.parametrize(
    ("op", "expected"),
    [("max", [0]), ("min", [14]), ("topk", [0, 1, 2]), ("median", [7]), ("average", [])],
    ids=["max", "min", "topk", "median", "average"],
)
def test_ideal_ranks(op: str, expected: list[int]) -> None:
    assert ideal_ranks(RunConfig(op=op)) == expected


def test_evaluation_is_a_pure_function_of_config_and_setting() -> None:
    base = RunConfig(op="max", n=6, graph="ring", trials=20, value_range=(15.0, 35.0))
    s = Setting("proposed", 100.0, 60.0, 1.0, 2000)
    a, b = evaluate(base, s), evaluate(base, s)
    assert (a.leak, a.leak_by_rank, a.iterations_p99) == (b.leak, b.leak_by_rank, b.iterations_p99)
    assert a.leak_by_rank[0] == 1.0  # the maximizer: the ideal world's


def test_tune_writes_a_run_toml_that_replays_the_choice(tmp_path: Path) -> None:
    base = RunConfig(op="max", n=6, graph="ring", trials=30, value_range=(15.0, 35.0))
    grid = [Setting("proposed", c, 0.6 * c, 1.0, 3000) for c in (30.0, 100.0)]
    result = tune(base, max_leak=0.5, budget=3000, settings=grid)
    assert result.meets_target
    path = tmp_path / "run.toml"
    path.write_text(run_toml(base, result.chosen_setting))
    cfg = load_config(path)
    assert (cfg.c, cfg.mu_z, cfg.t_max, cfg.value_range) == (
        result.chosen_setting.c,
        result.chosen_setting.mu_z,
        result.chosen_setting.t_max,
        (15.0, 35.0),
    )
    assert tomllib.loads(path.read_text())["run"]["init"] == "proposed"


def test_cli_rejects_a_target_outside_0_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.argv", ["nlagg", "tune", "--max-leak", "1.5", "--out", str(tmp_path / "r.toml")])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == "nlagg: error: max_leak=1.5: must lie in (0, 1]"
    assert not (tmp_path / "r.toml").exists()


def test_json_choice_says_when_the_target_is_not_met(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "r.toml"
    args = ["nlagg", "tune", "--op", "median", "--n", "7", "--graph", "ring", "--trials", "20"]
    args += [
        "--budget",
        "2000",
        "--max-leak",
        "0.001",
        "--value-range",
        "0",
        "10",
        "--json",
        "--out",
        str(out),
    ]
    monkeypatch.setattr("sys.argv", args)
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["meets_target"] is False  # the median's neighbours cross their values
    assert doc["choice"]["leak"] == min(e["leak"] for e in doc["evaluated"] if e["exact"])
    assert out.is_file()


@pytest.mark.parametrize(
    ("exact", "said"),
    [
        pytest.param(True, "no exact setting meets leakage <= 0.02 at the 95% upper bound", id="too-leaky"),
        pytest.param(False, "no setting is exact within 8000 iterations", id="none-exact"),
    ],
)
def test_an_unmet_target_says_why(exact: bool, said: str, tmp_path: Path) -> None:
    """Leaking too much and never converging are different failures, with different remedies."""
    from rich.console import Console

    from nlagg_node.cli.tune import print_result
    from nlagg_node.tune import TuneResult

    e = _eval(10.0, 0.05, 3000.0, exact=exact, trials=50)
    choice, met = choose([e], 0.02)
    assert not met
    result = TuneResult([e], pareto([e]), choice, choice.setting, met, 0.02, 8000, 0.0)
    console = Console(record=True, width=400)
    print_result(result, tmp_path / "run.toml", console)
    text = console.export_text()
    assert said in text
    assert ("raise --budget" in text) is not exact
