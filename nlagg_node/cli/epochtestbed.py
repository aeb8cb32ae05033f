"""``nlagg testbed --epochs K --every S``: K epochs of a continuous deployment on this machine."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..options import TestbedOptions
from ..options.epochs import deployment_drift

if TYPE_CHECKING:
    from ..config import RunConfig

__all__ = ["run_epoch_testbed_command"]


def run_epoch_testbed_command(opts: TestbedOptions, cfg: RunConfig, epochs: int, every: float) -> None:
    """Run the epochs and print the summary (one JSON object with ``--json``, else a line per epoch)."""
    from ..lab.epochtestbed import run_epoch_testbed
    from ..lab.testbed import new_run_id
    from ..lifetime import run_stoppable

    summary = run_stoppable(
        run_epoch_testbed(
            cfg,
            epochs,
            every,
            run_id=opts.run_id or new_run_id(),
            prefix=opts.prefix,
            broker_url=opts.broker,
            broker_kind=opts.broker_kind,
            in_process=opts.in_process,
            neighbour_timeout=opts.neighbour_timeout,
            out_dir=opts.out,
            drift=deployment_drift(opts.drift, opts.cold_start, cfg.value_range),
            cold_start=opts.cold_start,
            capture=True,
        )
    )
    if opts.out is not None:
        opts.out.mkdir(parents=True, exist_ok=True)
        (opts.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if opts.as_json:
        print(json.dumps(summary), flush=True)
        return
    k = len(summary["epochs"])
    print(f"run {summary['run_id']}: {cfg.op} of n={cfg.n}, {k} epochs every {every:g} s")
    exposed = {e["epoch"]: e for e in summary["capture"]["epochs"]} if "capture" in summary else {}
    for row in summary["epochs"]:
        if row["skipped"]:
            print(f"epoch {row['epoch']}: skipped (the previous epoch overran its period)")
            continue
        verdict = "exact" if row["exact"] else "NOT exact"
        lo, hi = row["true_interval"][0]
        truth = f"{lo}" if lo == hi else f"[{lo}, {hi}]"
        print(
            f"epoch {row['epoch']}: output {row['output']} (truth {truth}), {verdict},"
            f" {row['iterations']} iterations ({row['start']}), nodes present {len(row['present'])}/{cfg.n}"
        )
        if (seen := exposed.get(row["epoch"])) is not None:
            print(
                f"  eavesdropper: {exposure_text(seen['exposed'], row['ideal'])}"
                + (f" ({seen['error']})" if seen["error"] else "")
            )


def exposure_text(exposed: list[int], ideal: list[int]) -> str:
    """An epoch's exposures beside the ideal world's: which are unavoidable, which go beyond it."""
    if not exposed:
        return "exposed none"
    beyond = [i for i in exposed if i not in ideal]
    text = "exposed " + ", ".join(map(str, exposed))
    if not beyond:
        return text + " (holding the output: unavoidable)"
    return text + f" (beyond the ideal world: {', '.join(map(str, beyond))})"
