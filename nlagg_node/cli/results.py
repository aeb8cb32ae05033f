"""``nlagg results``: the output series of a continuous deployment, from the nodes' results files or
from its results topics (docs/continuous.md), printed and exported as CSV."""

from __future__ import annotations

import csv
import io
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..options import ResultsOptions
from ._app import app, setup_logging
from ._command import options_command

if TYPE_CHECKING:
    from ..runtime.outputs import EpochOutput

__all__ = ["results_cmd", "series_csv", "series_lines"]

CSV_FIELDS = ("epoch", "node", "output", "iterations", "time")

log = logging.getLogger("nlagg.results")


def series_lines(records: list[EpochOutput]) -> list[str]:
    """One line per epoch: its output(s) and the nodes that reported it."""
    by_epoch: dict[int, list[EpochOutput]] = {}
    for r in records:
        by_epoch.setdefault(r.epoch, []).append(r)
    lines = []
    for k in sorted(by_epoch):
        rs = sorted(by_epoch[k], key=lambda r: r.node)
        outputs = sorted({json.dumps(r.output) for r in rs})
        its = [r.iterations for r in rs]
        lines.append(
            f"epoch {k}: output {' / '.join(outputs)} (nodes {[r.node for r in rs]}, iterations"
            f" {min(its)}..{max(its)})"
        )
    return lines


def series_csv(records: list[EpochOutput]) -> str:
    """The records as CSV, by epoch then node; a top-K output is its values joined by ``;``."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for r in sorted(records, key=lambda r: (r.epoch, r.node)):
        value = ";".join(map(repr, r.output)) if isinstance(r.output, list) else repr(r.output)
        writer.writerow([r.epoch, r.node, value, r.iterations, repr(r.time)])
    return out.getvalue()


async def _subscribe(opts: ResultsOptions, run_id: str) -> list[EpochOutput]:
    """Every result heard on ``P/R/results/+`` within ``opts.wait`` seconds (the retained first)."""
    import asyncio
    import secrets

    from ..deploy.start import read_password, tls_settings
    from ..runtime.mqtt import MqttTransport
    from ..runtime.outputs import published_record, results_filter

    assert opts.broker is not None
    seen: dict[tuple[int, int], EpochOutput] = {}
    async with MqttTransport(
        opts.broker,
        client_id=f"nlagg-{run_id}-results-{secrets.token_hex(3)}",
        username=opts.username,
        password=read_password(opts.password_file),
        tls=tls_settings(opts.broker, opts.ca_file, None, None),
    ) as transport:
        await transport.subscribe(results_filter(opts.prefix, run_id))
        try:
            async with asyncio.timeout(opts.wait):
                async for msg in transport.messages():
                    if not msg.payload:
                        continue  # a cleared retained record: nothing of the series
                    try:
                        r = published_record(msg.topic, msg.payload)
                    except ValueError as exc:
                        log.warning("%s holds no output record of its node: %s", msg.topic, str(exc)[:200])
                        continue
                    seen[r.epoch, r.node] = r
        except TimeoutError:
            pass
    return list(seen.values())


@options_command(app, ResultsOptions, "results")
def results_cmd(opts: ResultsOptions) -> None:
    """Print a continuous deployment's outputs per epoch (from results files or its results topics)."""
    from ..lifetime import run_stoppable
    from ..private import write_private
    from ..runtime.outputs import read_outputs

    setup_logging(False)
    if bool(opts.file) == (opts.broker is not None):
        raise ConfigError("file", opts.file, "give results files (--file) or a --broker, one of them")
    if opts.file:
        records = [r for path in opts.file for r in read_outputs(Path(path))]
    else:
        if opts.run_id is None:
            raise ConfigError("run_id", None, "--broker needs the deployment's --run-id")
        records = run_stoppable(_subscribe(opts, opts.run_id))
    if opts.as_json:
        for r in sorted(records, key=lambda r: (r.epoch, r.node)):
            print(r.model_dump_json())
    else:
        print("\n".join(series_lines(records)) or "no results")
    if opts.csv is not None:
        write_private(opts.csv, series_csv(records))
