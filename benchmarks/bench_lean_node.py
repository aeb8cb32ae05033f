"""A lean node against the full install: install size, start-up to subscribed, and RSS.

    python benchmarks/bench_lean_node.py [--repeat 5] [--before-rev 758892a]

Install size: the files (``importlib.metadata``'s RECORD sizes) of every distribution an install
pulls in, the closure of nlagg's requirements as this interpreter has them installed, without extras
(a node: ``pip install .``) and with ``[lab]`` (``pip install '.[lab]'``).

Start-up: ``nlagg node`` (node 0 of a 2-node max run on a private Mosquitto, its neighbour never
started) from the spawn to its retained ``online`` status reaching a subscriber: a node announces
itself once it has subscribed, so this is start-up to subscribed (wall, and the node's CPU time,
the steadier figure on a loaded machine). RSS and CPU: the node's 3 s later, while it waits for its
neighbour with its run built. Three sides, taking turns: ``before`` (the
tree of ``--before-rev``, every dependency installed, as a node ran before issue 42), ``full``
(this tree, every dependency installed) and ``lean`` (this tree with every lab module refused at
import, as an install without extras; ``tests/harness/lean.py``). Prints one JSON line: the
medians, every run, and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata as md
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nlagg_node.config import RunConfig  # noqa: E402
from nlagg_node.runtime.brokers import start_mosquitto  # noqa: E402
from nlagg_node.runtime.mqtt import MqttTransport  # noqa: E402
from tests.harness.lean import lean_nlagg  # noqa: E402

ENTRY = "from nlagg_node.cli import main; main()"


def closure(extras: tuple[str, ...]) -> set[str]:
    """The distributions this checkout's ``nlagg[extras]`` pulls in (its pyproject's requirements,
    theirs as installed here), normalised names."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    top = list(project["dependencies"])
    for extra in extras:
        top += project["optional-dependencies"][extra]
    seen: set[str] = set()
    todo = [Requirement(line) for line in top]
    while todo:
        req = todo.pop()
        key = req.name.lower().replace("_", "-")
        if key in seen or key == "nlagg":
            continue
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            continue
        seen.add(key)
        envs = [{"extra": e} for e in req.extras] or [{"extra": ""}]
        for line in dist.requires or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate(env) for env in envs):
                todo.append(sub)
    return seen


def install_bytes(names: set[str]) -> int:
    total = 0
    for name in names:
        for f in md.distribution(name).files or []:
            total += f.size or 0
    return total


SETTLE = 3.0
"""Seconds after ``online`` at which the RSS is read: the node has built its run and waits for its
absent neighbour (it reads its graph after it announced itself)."""


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def startup(
    argv: list[str], env: dict[str, str], url: str, run_id: str, cwd: Path
) -> tuple[float, float, float, int]:
    """Seconds (wall, and CPU of the node) from the spawn of ``argv`` to its ``online`` status, and
    :data:`SETTLE` seconds later its CPU seconds and VmRSS (KiB)."""
    async with MqttTransport(url, client_id=f"bench-{run_id}") as watch:
        await watch.subscribe(f"nlagg/{run_id}/node/0/status")
        started = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            *argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            async with asyncio.timeout(120):
                async for msg in watch.messages():
                    if b'"online"' in msg.payload:
                        break
            seconds, cpu = time.perf_counter() - started, cpu_seconds(proc.pid)
            await asyncio.sleep(SETTLE)
            rss, settled = rss_kib(proc.pid), cpu_seconds(proc.pid)
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    return seconds, cpu, settled, rss


def before_tree(rev: str, dest: Path) -> Path:
    """The tree of ``rev`` (``git archive``) in ``dest``."""
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest


async def measure(repeat: int, before: Path) -> dict[str, Any]:
    cfg = RunConfig(op="max", n=2, graph="complete", seed=1)
    base_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    sides = {
        "before": ([sys.executable, "-c", ENTRY], {**base_env, "PYTHONPATH": str(before)}),
        "full": ([sys.executable, "-c", ENTRY], {**base_env, "PYTHONPATH": str(ROOT)}),
        "lean": (lean_nlagg(), {**base_env, "PYTHONPATH": str(ROOT)}),
    }
    runs: dict[str, list[tuple[float, float, float, int]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "run.json"
        config.write_text(json.dumps({"config": cfg.model_dump(mode="json")}))
        async with start_mosquitto() as broker:
            for r in range(repeat):
                for side, (program, env) in sides.items():  # the sides take turns
                    run_id = f"{side}{r}"
                    argv = [*program, "node", "--id", "0", "--config", str(config), "--value", "0.5"]
                    argv += ["--broker", broker.url, "--run-id", run_id, "--neighbour-timeout", "60"]
                    # cwd outside both trees: ``python -c`` puts it first on sys.path
                    runs[side].append(await startup(argv, env, broker.url, run_id, Path(tmp)))
    return {
        side: {
            "startup_to_subscribed_s": round(statistics.median(g[0] for g in got), 3),
            "cpu_to_subscribed_s": round(statistics.median(g[1] for g in got), 3),
            "cpu_settled_s": round(statistics.median(g[2] for g in got), 3),
            "rss_mib": round(statistics.median(g[3] for g in got) / 1024, 1),
            "runs": [[round(w, 3), round(c, 2), round(t, 2), round(r / 1024, 1)] for w, c, t, r in got],
        }
        for side, got in runs.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--before-rev", default="758892a", help="the tree a node ran before (git rev)")
    args = ap.parse_args()
    lean, full = closure(()), closure(("lab",))
    sizes = {
        "lean": {"distributions": len(lean), "mib": round(install_bytes(lean) / 2**20, 1)},
        "full": {"distributions": len(full), "mib": round(install_bytes(full) / 2**20, 1)},
        "lab_only": sorted(full - lean),
    }
    with tempfile.TemporaryDirectory() as tmp:
        before = before_tree(args.before_rev, Path(tmp))
        nodes = asyncio.run(measure(args.repeat, before))
    load = os.getloadavg()
    print(json.dumps({"install": sizes, "node": nodes, "load": [round(x, 1) for x in load]}))


if __name__ == "__main__":
    main()
