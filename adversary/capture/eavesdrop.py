"""``nlagg eavesdrop``: run an :class:`~adversary.capture.eavesdropper.Eavesdropper` on one broker or several
(the bridged site brokers of one run), with a live rich table, or JSON-line events for a supervising
process (the testbed), and a summary at the end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nlagg_node.runtime.tls import TlsSettings
from nlagg_node.runtime.wire import ConfigMsg

from ..live import Exposure
from ..transcript.writer import Transcript
from .eavesdropper import Eavesdropper, NodeView
from .merged import MergedSubscriber
from .subscriber import AckingSubscriber, accepts_anonymous

__all__ = ["ANONYMOUS_WARNING", "live_table", "run_eavesdropper"]

log = logging.getLogger("nlagg.eavesdropper")

ANONYMOUS_WARNING = (
    "broker %s admits anonymous clients (allow_anonymous true): anyone can publish as any node, so"
    " nothing protects the run's integrity; use the per-node ACL of nlagg deploy plan"
)


def live_table(eaves: Eavesdropper) -> Any:
    """A rich table: per node, iterations seen, its latest branch, and what is already exposed."""
    from rich.table import Table

    n = eaves.config.n if eaves.config is not None else (max(eaves.nodes, default=-1) + 1)
    title = f"run {eaves.transcript.run_id}: {eaves.captured} messages"
    if eaves.config is None:
        title += " (waiting for the retained config)"
    table = Table(title=title)
    for col in ("node", "state", "iterations", "last x", "revealed"):
        table.add_column(col)
    for i in range(n):
        v = eaves.nodes.get(i, NodeView())
        if v.corrupted:
            revealed = f"[yellow]corrupted: s = {v.private_value!r}[/yellow]"
        elif v.exposed is not None:
            revealed = f"[red]s = {v.exposed.value!r} (t={v.exposed.t}, {v.exposed.how})[/red]"
        else:
            revealed = "nothing yet"
        table.add_row(str(i), v.state, str(v.iterations), v.branch, revealed)
    return table


def _event(kind: str, **fields: object) -> None:
    print(json.dumps({"event": kind, **fields}), flush=True)


async def run_eavesdropper(
    broker: str | Sequence[str],
    run_id: str,
    db: Path,
    *,
    prefix: str = "nlagg",
    username: str | None = None,
    password: str | None = None,
    live: bool = True,
    stop_after: float | None = None,
    events: bool = False,
    config: ConfigMsg | None = None,
    tls: TlsSettings | None = None,
    broker_cluster: bool = False,
) -> Eavesdropper:
    """``nlagg eavesdrop``: capture until every node is done (or ``stop_after`` s), then print a summary.

    With ``events`` the output is JSON lines for a supervising process (the testbed):
    ``subscribed``, one ``exposure`` per exposed node the moment it is found, ``finished``.
    ``tls`` verifies an ``mqtts://`` broker (and gives a client certificate when it asks for one).
    ``broker`` may list several brokers (the bridged site brokers of one run): the capture then
    subscribes at every one of them, into one transcript that holds each message once.
    ``broker_cluster``: the broker is a cluster whose members may forward the messages of different
    nodes out of causal order; an x that overtook those it was computed from waits for them.
    At start it asks the broker whether it admits anonymous clients and warns when it does:
    without per-node ACLs nothing protects the run's integrity (anyone can publish as any node;
    the transcript keeps what the nodes kept, which may be forged).
    """
    from rich.console import Console
    from rich.live import Live

    console = Console()
    live = live and not events
    transcript = Transcript(db, run_id=run_id, prefix=prefix)
    client_id = f"nlagg-{run_id}-eavesdropper"
    brokers = [broker] if isinstance(broker, str) else list(broker)
    for url in brokers:
        if await accepts_anonymous(url, tls=tls):
            log.warning(ANONYMOUS_WARNING, url)
            if events:
                _event("warning", message=ANONYMOUS_WARNING % url)
    try:
        # --timeout bounds the whole capture, the first connection included.
        connect_within = 30.0 if stop_after is None else max(0.1, min(30.0, stop_after))
        subscribers = [
            AckingSubscriber(
                url,
                client_id=client_id,
                username=username,
                password=password,
                tls=tls,
                connect_timeout=connect_within,
            )
            for url in brokers
        ]
        source = subscribers[0] if len(subscribers) == 1 else MergedSubscriber(subscribers)
        async with source as tr:

            def report(e: Exposure) -> None:
                if events:
                    _event("exposure", node=e.node, t=e.t, value=e.value, how=e.how)
                elif not live:
                    console.print(f"exposed: node {e.node} at t={e.t} ({e.how}): s = {e.value!r}")

            eaves = Eavesdropper(tr, transcript, on_exposure=report, config=config, reorder=broker_cluster)
            task = asyncio.create_task(eaves.run())
            # SIGTERM/SIGINT stop the capture through the normal path: everything is committed.
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, task.cancel)
            await eaves.subscribed.wait()
            if events:
                _event("subscribed")
            try:
                async with asyncio.timeout(stop_after):
                    if live:
                        with Live(live_table(eaves), console=console, refresh_per_second=4) as view:
                            while not task.done():
                                await asyncio.wait({task}, timeout=0.25)
                                view.update(live_table(eaves))
                    await asyncio.wait({task})
                    if not task.cancelled():
                        task.result()  # re-raise a capture failure
            except TimeoutError:
                if not events:
                    console.print(f"stopped after {stop_after:g} s")
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    finally:
        transcript.close()
    if events:
        _event(
            "finished",
            complete=eaves.finished.is_set(),
            captured=eaves.captured,
            stored=eaves.stored,
            rejected=eaves.rejected,
            missing_x=eaves.missing[0],
            missing_z0=eaves.missing[1],
            missing_adv=eaves.missing_adv,
            exposed=eaves.honest_exposed(),
            departed={str(j): t for j, t in sorted(eaves.departed().items())},
        )
    else:
        console.print(
            f"{eaves.captured} messages captured into {db} ({eaves.rejected} not protocol v1); "
            f"exposed honest nodes: {eaves.honest_exposed() or 'none'}"
        )
        for j, t in sorted(eaves.departed().items()):
            console.print(f"node {j} left the run at t={t} (its last x was x^({t - 1}))")
    return eaves
