"""``nlagg node``, ``nlagg eavesdrop``: one client of a real MQTT broker, and its TLS options.

``nlagg testbed`` (a whole network on this machine) is in :mod:`nlagg_node.cli.testbed`.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..defaults import DEFAULT_BROKER
from ..options import NodeOptions
from ._app import TRANSCRIPT_HELP, VerboseOpt, app, setup_logging
from ._command import options_command

if TYPE_CHECKING:
    from ..runtime.tls import TlsSettings


CaFile = Annotated[
    Path | None, typer.Option(help="mqtts://: CA certificate that verifies the broker (a plan's tls/ca.pem)")
]
CertFile = Annotated[Path | None, typer.Option(help="mqtts://: client certificate, when the broker asks")]
KeyFile = Annotated[Path | None, typer.Option(help="mqtts://: the client certificate's private key")]


def tls_settings(
    broker: str, ca_file: Path | None, cert_file: Path | None, key_file: Path | None
) -> TlsSettings | None:
    """The :class:`TlsSettings` of ``--ca-file/--cert-file/--key-file`` (None for a plain mqtt:// broker)."""
    from ..deploy.start import tls_settings as settings

    return settings(broker, ca_file, cert_file, key_file)


@options_command(app, NodeOptions)
def node(opts: NodeOptions) -> None:
    """Run one node: connect, announce, exchange z^(0), iterate with the neighbour barrier, publish done."""
    from ..deploy.start import result_lines, start_node

    setup_logging(opts.verbose)
    logging.getLogger("nlagg.progress").setLevel(logging.INFO)  # a line every few seconds (stderr)
    result = start_node(opts)
    if opts.as_json:
        print(json.dumps(result))
    else:
        print("\n".join(result_lines(opts.id, result)))


@app.command()
def eavesdrop(
    run_id: Annotated[str, typer.Option(help="the run to capture")],
    broker: Annotated[
        list[str] | None,
        typer.Option(
            help="broker URL, mqtt://host[:port]; repeat it for every site broker of a run with sites"
            f" (one transcript, each message once) [default: {DEFAULT_BROKER}]"
        ),
    ] = None,
    transcript: Annotated[
        Path,
        typer.Option(help=TRANSCRIPT_HELP + " to write (created, or continued when it holds this run)"),
    ] = Path("transcript.sqlite"),
    prefix: Annotated[str, typer.Option(help="topic prefix")] = "nlagg",
    username: Annotated[str | None, typer.Option(help="broker user name")] = None,
    password_file: Annotated[Path | None, typer.Option(help="file holding the broker password")] = None,
    live: Annotated[bool | None, typer.Option(help="live view (default: when stdout is a terminal)")] = None,
    timeout: Annotated[float | None, typer.Option(help="stop after this many seconds")] = None,
    events: Annotated[bool, typer.Option(help="print JSON-line events (for a supervising process)")] = False,
    config: Annotated[
        Path | None, typer.Option(help="the run's config file, if the retained P/R/config is not published")
    ] = None,
    broker_cluster: Annotated[
        bool,
        typer.Option(
            help="the broker is a cluster (RabbitMQ, EMQX, VerneMQ) whose members may forward messages"
            " out of causal order: an x that overtook the x's it was computed from waits for them (5 s)"
        ),
    ] = False,
    ca_file: CaFile = None,
    cert_file: CertFile = None,
    key_file: KeyFile = None,
    dashboard: Annotated[
        str | None,
        typer.Option(
            help="serve the live dashboard at :PORT or HOST:PORT (loopback unless a host is given);"
            " it keeps serving the finished capture until Ctrl-C"
        ),
    ] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Capture every message of a run into SQLite and show per node what the transcript reveals."""
    from adversary.eavesdrop import run_eavesdropper

    from ..lifetime import run_stoppable

    setup_logging(verbose)
    from ..deploy.start import read_password

    password = read_password(password_file)
    brokers = broker or [DEFAULT_BROKER]
    tls = tls_settings(brokers[0], ca_file, cert_file, key_file)
    for url in brokers[1:]:  # the TLS files must suit every broker
        tls_settings(url, ca_file, cert_file, key_file)
    show = sys.stdout.isatty() if live is None else live
    public = None
    if config is not None:
        from ..config import load_config
        from ..runtime.public import build_config_msg, run_edges

        cfg = load_config(config)
        public = build_config_msg(cfg, run_id, run_edges(cfg))
    capture = run_eavesdropper(
        brokers,
        run_id,
        transcript,
        prefix=prefix,
        username=username,
        password=password,
        live=show,
        stop_after=timeout,
        events=events,
        config=public,
        tls=tls,
        broker_cluster=broker_cluster,
    )
    if dashboard is None:
        run_stoppable(capture)
        return
    from adversary.dashboard import parse_listen, serve_beside

    try:
        parse_listen(dashboard)  # a bad address fails before anything starts
    except BaseException:
        capture.close()
        raise
    run_stoppable(
        serve_beside(transcript, dashboard, capture, lambda line: print(line, file=sys.stderr, flush=True))
    )
