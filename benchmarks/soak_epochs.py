"""Soak a continuous deployment: K epochs of a 10-node plan on Mosquitto, with faults on a schedule.

The deployment is ``nlagg deploy plan --every S --epochs K`` (max, values in [0, 100], c = 10,
mu_z = 30) as the plan writes it: its Mosquitto configuration (passwords, the continuous ACL,
persistence), each node ``nlagg deploy node nodes/<i>.toml`` in its own process, and ``nlagg
eavesdrop --continuous --keep-epochs N`` (tests/harness/epochsoak.py). Values follow a pinned
random walk within the declared drift (a fraction of the range), written to the value files half a
period before each epoch, so every epoch's truth is known. Faults (at fractions of the run): node
1, 4 and 7 SIGKILLed mid-epoch and restarted; the eavesdropper SIGKILLed mid-epoch and restarted
twice; the broker stopped mid-epoch and started again; node n-1 stopped (SIGTERM) for K/40 epochs.

Printed: each epoch that is not exact or misses a node (and why); the epochs exact for the nodes
present; the epochs in the store and the results it holds of those the nodes wrote; the attack's
combined intervals' soundness on the store (``attack_epochs(store, drift).interval_soundness``);
each process's RSS at epoch 20 (20 epochs after a restart) and at the end; the store's size.
Targets: every epoch exact, nothing lost, soundness 1.0, RSS growth <= 10%.

    python benchmarks/soak_epochs.py [--epochs 200] [--every 8] [--n 10] [--drift 0.005] [--keep-epochs 5]
        [--cold-start] [--strike-at 0.1] [--workdir DIR]

Each life's RSS is printed with its anonymous part (the heap) beside it; ``logs/rss.csv`` under the
work folder holds every sample (VmRSS, RssAnon, RssFile, RssShmem in KiB, per life and epoch).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nlagg_node.runtime.brokers import mosquitto_binary
from tests.harness.epochsoak import Soak, SoakReport, SoakSettings


def show(report: SoakReport, settings: SoakSettings) -> bool:
    """Print the figures; True when every target is met."""
    for line in report.faults:
        print(f"fault: {line}")
    for e in report.epochs:
        if not e.exact or e.missing:
            state = "exact" if e.exact else "skipped by every node" if not e.present else "NOT EXACT"
            off = f" (off by {e.error:.3g})" if e.present and not e.exact else ""
            why: dict[str, list[int]] = {}
            for i, reason in sorted(e.missing.items()):
                why.setdefault(reason, []).append(i)
            missing = "; ".join(f"{nodes} {reason}" for reason, nodes in why.items())
            print(f"epoch {e.epoch:3d}: {state}{off}, present {e.present}, missing: {missing}")
    ran = [e for e in report.epochs if e.present]
    exact = sum(e.exact for e in ran)
    whole = sum(len(e.present) == settings.n for e in ran)
    iters = sorted(e.iterations for e in ran)
    print(
        f"epochs run: {len(ran)}/{settings.epochs} (every node present: {whole}); skipped by every node: "
        f"{settings.epochs - len(ran)}"
    )
    print(f"epochs exact for the nodes present: {exact}/{len(ran)}")
    print(
        "starts of the epochs the nodes finished: "
        + ", ".join(f"{k} {v}" for k, v in sorted(report.starts.items()))
    )
    print(
        f"iterations per epoch: median {iters[len(iters) // 2] if iters else 0}, max {max(iters, default=0)}"
    )
    print(f"value files written late: {report.late_values or 'none'}")
    lost = len({e.epoch for e in ran} - set(report.in_store) - set(report.open_in_store))
    print(
        f"store: {len(report.in_store)} epochs closed or pruned, of the {len(ran)} run ({lost} missing), "
        f"open {report.open_in_store}; results {report.results_in_store}/{report.results_published}"
        " of those the nodes wrote"
    )
    print(
        f"attack: combined intervals' soundness {report.soundness:.4f}, "
        f"consistent {report.combined_consistent}"
    )
    worst = 0.0
    for name, since, base_at, base, end, anon_base, anon_end in report.rss:
        if base is None or end is None:
            print(
                f"rss {name:12s} (from epoch {since}): {end} KiB at its end (too short-lived for a baseline)"
            )
            continue
        growth = end / base - 1
        worst = max(worst, growth)
        heap = f"; heap {anon_base} to {anon_end} KiB" if None not in (anon_base, anon_end) else ""
        print(
            f"rss {name:12s} (from epoch {since}): {base} KiB at epoch {base_at}, "
            f"{end} KiB at the end ({growth:+.1%}{heap})"
        )
    print(
        f"store size (--keep-epochs {settings.keep_epochs}): max {report.store_bytes_max / 1e6:.2f} MB, "
        f"at the end {report.store_bytes_end / 1e6:.2f} MB"
    )
    print(f"wall time: {report.wall:.0f} s")
    ok = exact == len(ran) and lost == 0 and report.results_in_store == report.results_published
    return ok and report.soundness == 1.0 and worst <= 0.10


async def soak(settings: SoakSettings, workdir: Path, strike_at: float) -> bool:
    started = time.time()
    print(
        f"soak: {settings.epochs} epochs every {settings.every:g} s, n={settings.n}, max, drift "
        f"{settings.drift:g} of the range{' (warm starts)' * settings.warm}, seed {settings.seed}, "
        f"load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    async with Soak(settings, workdir) as bed:
        await bed.run(mid=strike_at)
        report = bed.report(started)
    return show(report, settings)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--every", type=float, default=8.0, help="the period S in seconds")
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--drift", type=float, default=0.005, help="a fraction of the value range")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep-epochs", type=int, default=5)
    parser.add_argument("--cold-start", action="store_true", help="every epoch cold (default: warm starts)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the plan, store and logs here")
    parser.add_argument(
        "--strike-at",
        type=float,
        default=0.1,
        help="faults strike this fraction of the period after an epoch's start (inside its run: a warm"
        " epoch of max at n = 10 runs about 2 s on the certified stop)",
    )
    args = parser.parse_args()
    if mosquitto_binary() is None:
        print("soak: the mosquitto binary is needed (apt-get install mosquitto)", file=sys.stderr)
        return 2
    settings = SoakSettings(
        args.epochs, args.every, args.n, args.drift, args.seed, args.keep_epochs, warm=not args.cold_start
    )
    if args.workdir is not None:
        return 0 if asyncio.run(soak(settings, args.workdir, args.strike_at)) else 1
    with tempfile.TemporaryDirectory(prefix="nlagg-soak-epochs-") as tmp:
        return 0 if asyncio.run(soak(settings, Path(tmp), args.strike_at)) else 1


if __name__ == "__main__":
    sys.exit(main())
