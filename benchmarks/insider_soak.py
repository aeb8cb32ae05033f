"""Insider soak: deployed plans whose node 0 is run by an insider holding its whole bundle (issue 43).

Every run is a plan as ``nlagg deploy plan`` writes it (its Mosquitto configuration, ACL, identities,
launcher; ``tests/harness/planbed.py``), a ring of 6, trial 0 of its own seed; node 0's own process
publishes its own signed x's with forged early-stop fields (``tests/harness/turncoat.py``), one
forgery per run, the kinds in turn (:data:`KINDS`), the forged iterations drawn at random:

* ``stop-early``: a stop before the phase's earliest (median);
* ``stop-plausible``: stops ``t + 3`` proposed while the nodes were still moving (median);
* ``stop-halt``: node 0 claims it ended its phase on a stop at t = 300 (max, certified);
* ``quiet-high`` / ``quiet-zero``: a quiet counter of 10^6, or 0, over 50 iterations (max, median);
* ``cand-1e6``, ``cand-min``: a certified candidate beyond the one-sided start (max 1e6, min -1e6);
* ``cand-range``: a candidate outside the declared range (150 in [0, 100]);
* ``cand-in-bound``: a candidate just short of the start (2.98): taken, and as far as it goes;
* ``cand-low``: a candidate below every value (max: no effect).
* ``status-departed``: node 0's signed status claims its neighbour 1 departed (max, ``may_depart``)
  while node 1 is connected throughout: node 1 refuses it (before, it stopped, and the ring with it);
* ``status-stranger``: its status claims node 3, no neighbour of it, departed: refused;
* ``status-leaving``: its status says it leaves at t + 3 while it goes on publishing x's (median):
  its neighbours count it departed, it is refused by them, and the run ends loudly (an insider can
  always stall a run by falling silent while connected: exit 1 with the node named, never exit 0);
* ``takeover``, ``takeover-fixed``: node 0's session taken over every 0.3 s from the start
  (``tests/harness/takeover.py``), with ``may_depart`` (node 0 is absent, the others finish) and
  without (the run cannot survive a departure: it must fail loudly, never exit 0 beyond the bound).
* ``results-own``, ``results-unsigned``, ``results-other``: on a continuous plan's broker, a
  forged record of epoch 0 (output 99 in [0, 100]) with node 0's password, signed with its own key,
  with none, or on node 1's topic with node 0's key, beside 1-3 honest records drawn
  (``tests/harness/records.py``): the warm start every node reads before epoch 1 is cold or the
  honest output, never the forger's; a record its node did not sign is refused, named.

A run passes when no honest node (1-5) exits 0 with an output beyond bounded influence (what node 0
could cause by claiming any value a node may hold: ``bounded_influence``), and every forgery a node
refuses is named in node 0's neighbours' logs (nodes 1 and 5), or in the warm-start reader's.

    python benchmarks/insider_soak.py [--runs 20] [--seed 0] [--kinds stop-early,takeover,...]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nlagg_node.config import RunConfig
from nlagg_node.deploy.continuous import EpochTimetable
from nlagg_node.rng import rng_for
from nlagg_node.runtime.brokers import mosquitto_binary

# The harness is a test fixture (tests/harness/), not part of the installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.harness.planbed import PlanBed
from tests.harness.records import Records
from tests.harness.takeover import take_over_again_and_again
from tests.harness.turncoat import Forge, bounded_influence

LATE = 10**6
DEPART = {"op": "max", "may_depart": True}
RANGE = {"op": "max", "value_range": (0.0, 100.0)}


@dataclass(frozen=True)
class Kind:
    """One forgery: the run's options, the forge from the drawn iteration, the refusal named (None:
    the forgery is taken, within bounded influence)."""

    kw: dict[str, Any]
    forge: Callable[[int], Forge] | None
    refusal: str | None
    takeover: bool = False
    results: tuple[int, int | None] | None = None  # node 0's forged record: (topic of node, signer)


KINDS: dict[str, Kind] = {
    "stop-early": Kind({"op": "median"}, lambda t: Forge(t, t + 5, stop=t + 5), "before the earliest stop"),
    "stop-plausible": Kind({"op": "median"}, lambda t: Forge(t + 140, t + 142, stop_ahead=3), "from node 0"),
    "stop-halt": Kind({"op": "max"}, lambda t: Forge(296, 300, stop=300), "node 0 ended its phase on it"),
    "quiet-high": Kind({"op": "max"}, lambda t: Forge(t, t + 50, quiet=10**6), None),
    "quiet-zero": Kind({"op": "median"}, lambda t: Forge(t + 100, t + 150, quiet=0), None),
    "cand-1e6": Kind({"op": "max"}, lambda t: Forge(t, LATE, cand=1e6), "not below the from-above start"),
    "cand-min": Kind({"op": "min"}, lambda t: Forge(t, LATE, cand=-1e6), "not above the from-below start"),
    "cand-range": Kind(
        {"op": "max", "value_range": (-5.0, 5.0)}, lambda t: Forge(t, LATE, cand=1.5), "outside [0, 1]"
    ),
    "cand-in-bound": Kind({"op": "max"}, lambda t: Forge(t, LATE, cand=2.98), None),
    "cand-low": Kind({"op": "max"}, lambda t: Forge(t, LATE, cand=-1e6), None),
    "status-departed": Kind(DEPART, lambda t: Forge(t, t, departed={"1": t}), "connected throughout"),
    "status-stranger": Kind(DEPART, lambda t: Forge(t, t, departed={"3": t}), "not a neighbour of node 0"),
    "status-leaving": Kind({**DEPART, "op": "median"}, lambda t: Forge(t, t, leaving=t + 3), None),
    "takeover": Kind(DEPART, None, None, takeover=True),
    "takeover-fixed": Kind({"op": "max"}, None, None, takeover=True),
    "results-own": Kind(RANGE, None, None, results=(0, 0)),
    "results-unsigned": Kind(RANGE, None, "unsigned message", results=(0, None)),
    "results-other": Kind(RANGE, None, "does not verify with node 1's identity", results=(1, 0)),
}
FORGED_OUTPUT = 99.0  # node 0's forged record, above every honest output drawn


async def one_run(kind: Kind, seed: int, t: int, workdir: Path) -> tuple[bool, str]:
    if kind.results is not None:
        return await records_run(kind, seed, t, workdir)
    cfg = RunConfig(n=6, graph="ring", trials=1, seed=seed, **kind.kw)
    turncoat = None if kind.forge is None else (0, kind.forge(t))
    async with PlanBed(cfg, workdir, run_id=f"insider-{seed}") as bed:
        stop = asyncio.Event()
        attacker = asyncio.create_task(take_over_again_and_again(bed, 0, stop)) if kind.takeover else None
        try:
            await bed.start_nodes(extra=["--neighbour-timeout", "20"], turncoat=turncoat)
            outcomes = await bed.outcomes(within=600.0)
        finally:
            stop.set()
            taken = 0 if attacker is None else await attacker
    lo, hi = bounded_influence(bed.cfg, [v for i, v in bed.plan.values.items() if i != 0])
    slack = 1e-6 * (hi - lo)
    outputs = {i: r["output"][0] for i, (rc, r) in outcomes.items() if rc == 0 and r is not None}
    beyond = {i: o for i, o in outputs.items() if i != 0 and not lo - slack <= o <= hi + slack}
    logs = [(bed.logs / f"node{i}.log").read_text() for i in (1, 5)]
    refused = sum(log.count(f) for log in logs for f in ("from node 0", "cand of x_0^(", "status of node 0"))
    named = kind.refusal is None or any(kind.refusal in log for log in logs)
    codes = "".join(str(rc) if rc < 10 else "x" for rc, _ in outcomes.values())
    node1 = outputs.get(1)
    what = (
        f"exit codes {codes}, node 1 output {'-' if node1 is None else f'{node1:.6g}'}"
        f" in [{lo:.6g}, {hi:.6g}], refusals named at nodes 1/5: {refused}"
    )
    if kind.takeover:
        what += f", takeovers {taken}"
    if beyond:
        what += f"; BEYOND: {beyond}"
    if not named:
        what += f"; refusal {kind.refusal!r} not named"
    return not beyond and named, what


class Warnings(logging.Handler):
    """The warnings logged in this process (the warm-start reader's refusals)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def records_run(kind: Kind, seed: int, t: int, workdir: Path) -> tuple[bool, str]:
    """Node 0's forged record beside ``1 + t % 3`` honest ones of output ``50 + t``; node 4's warm start."""
    assert kind.results is not None
    topic_of, signer = kind.results
    cfg = RunConfig(n=6, graph="ring", trials=1, seed=seed, **kind.kw)
    schedule = EpochTimetable(every=60.0, origin=time.time() + 3600.0, epochs=2)  # no epoch runs
    honest, writers = 50.0 + t, (2, 3, 5)[: 1 + t % 3]
    caught = Warnings()
    logging.getLogger("nlagg.node").addHandler(caught)
    try:
        async with PlanBed(cfg, workdir, run_id=f"insider-{seed}", capture=False, schedule=schedule) as bed:
            records = Records(bed)
            for i in writers:
                await records.publish(i, honest, i)
            await records.publish(topic_of, FORGED_OUTPUT, signer)
            heard = await records.warm_start()
    finally:
        logging.getLogger("nlagg.node").removeHandler(caught)
    steered = heard is not None and heard.output != honest
    named = kind.refusal is None or any(kind.refusal in line for line in caught.lines)
    start = "cold" if heard is None else f"{heard.output:g}"
    what = f"honest records {len(writers)} of {honest:g}, warm start {start}"
    if steered:
        what += "; STEERED by the forged record"
    if not named:
        what += f"; refusal {kind.refusal!r} not named"
    return not steered and named, what


async def soak(runs: int, seed: int, kinds: list[str]) -> int:
    rng = rng_for(seed, "insider-soak")
    names = [kinds[k % len(kinds)] for k in range(runs)]
    ok_runs = 0
    started = time.perf_counter()
    print(f"insider soak: {runs} runs, ring of 6, node 0's whole bundle, kinds {', '.join(kinds)}")
    with tempfile.TemporaryDirectory(prefix="nlagg-insider-soak-") as tmp:
        for k, name in enumerate(names):
            run_seed, t = seed + k, int(rng.integers(5, 40))
            t0 = time.perf_counter()
            ok, what = await one_run(KINDS[name], run_seed, t, Path(tmp) / f"run-{k}")
            ok_runs += ok
            print(
                f"run {k + 1:2d} {name:14s} seed {run_seed:3d} t={t:2d}: {'ok' if ok else 'FAIL'}  {what}"
                f"  {time.perf_counter() - t0:5.1f} s",
                flush=True,
            )
    print(f"runs within bounded influence, every refusal named: {ok_runs}/{runs}")
    print(f"wall time: {time.perf_counter() - started:.0f} s")
    return 0 if ok_runs == runs else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", default=",".join(KINDS), help="the forgeries, in turn (default: all)")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    if unknown := [k for k in kinds if k not in KINDS]:
        parser.error(f"--kinds={args.kinds}: unknown {', '.join(unknown)} (known: {', '.join(KINDS)})")
    if mosquitto_binary() is None:
        print("insider soak: the mosquitto binary is needed (apt-get install mosquitto)", file=sys.stderr)
        return 2
    return asyncio.run(soak(args.runs, args.seed, kinds))


if __name__ == "__main__":
    sys.exit(main())
