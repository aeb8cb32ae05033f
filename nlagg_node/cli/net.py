"""``nlagg node``, ``nlagg eavesdrop``: one client of a real MQTT broker, and its TLS options.

``nlagg testbed`` (a whole network on this machine) is in :mod:`nlagg_node.cli.testbed`.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..defaults import DEFAULT_BROKER
from ..options import EavesdropOptions, NodeOptions
from ._app import app, may_create, setup_logging
from ._command import options_command

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from adversary.capture import CaptureSession

    from ..runtime.tls import TlsSettings


CaFile = Annotated[
    Path | None, typer.Option(help="mqtts://: CA certificate that verifies the broker (a plan's tls/ca.pem)")
]
CertFile = Annotated[Path | None, typer.Option(help="mqtts://: client certificate, when the broker asks")]
KeyFile = Annotated[Path | None, typer.Option(help="mqtts://: the client certificate's private key")]


CaptureTarget = tuple[list[str], str, Path]
"""What ``nlagg eavesdrop`` captures and where: its brokers, the run id (a deployment's, with
``--continuous``) and the transcript (an epoch store's folder with ``--continuous``)."""


def tls_settings(
    broker: str, ca_file: str | Path | None, cert_file: str | Path | None, key_file: str | Path | None
) -> TlsSettings | None:
    """The :class:`TlsSettings` of ``--ca-file/--cert-file/--key-file`` (None for a plain mqtt:// broker)."""
    from ..deploy.start import tls_settings as settings

    return settings(broker, ca_file, cert_file, key_file)


@options_command(app, NodeOptions)
def node(opts: NodeOptions) -> None:
    """Run one node: connect, announce, exchange z^(0), iterate with the neighbour barrier, publish done."""
    run_node_command(opts)


def run_node_command(opts: NodeOptions) -> None:
    """Start a node and print its result (``nlagg node``, ``nlagg deploy node``)."""
    from ..deploy.epochnode import check_epoch_options, print_epochs
    from ..deploy.start import prepare_node, result_lines, start_node
    from ..lifetime import run_stoppable

    setup_logging(opts.verbose)
    if not opts.quiet:
        logging.getLogger("nlagg.progress").setLevel(logging.INFO)  # a line every few seconds (stderr)
    check_epoch_options(opts)
    if opts.state_dir is not None:
        may_create(Path(opts.state_dir))
    if opts.every is not None:  # a continuous deployment: a line per epoch
        run_stoppable(print_epochs(prepare_node(opts), opts.as_json))
        return
    result = start_node(opts)
    if opts.as_json:
        print(json.dumps(result))
    else:
        print("\n".join(result_lines(opts.id, result)))


@options_command(app, EavesdropOptions)
def eavesdrop(opts: EavesdropOptions) -> None:
    """Capture every message of a run into SQLite and show per node what the transcript reveals."""
    from adversary.capture import CaptureSession, run_eavesdropper

    from ..deploy.start import read_password

    setup_logging(opts.verbose)
    password = read_password(opts.password_file)
    brokers = opts.broker or [DEFAULT_BROKER]
    tls = tls_settings(brokers[0], opts.ca_file, opts.cert_file, opts.key_file)
    for url in brokers[1:]:  # the TLS files must suit every broker
        tls_settings(url, opts.ca_file, opts.cert_file, opts.key_file)
    session = CaptureSession(
        prefix=opts.prefix,
        username=opts.username,
        password=password,
        live=sys.stdout.isatty() and not opts.quiet if opts.live is None else opts.live,
        stop_after=opts.timeout,
        events=opts.events,
        tls=tls,
    )
    target = (brokers, opts.run_id, opts.transcript)
    if opts.continuous:  # the epoch options need it (EavesdropOptions.NEEDS)
        capture_epochs(opts, target, session)
        return
    public = None
    if opts.config is not None:
        from ..config import load_config
        from ..deploy.identities import run_identities
        from ..runtime.public import build_config_msg, run_edges

        cfg = load_config(Path(opts.config))
        public = build_config_msg(cfg, opts.run_id, run_edges(cfg), run_identities(Path(opts.config)))
    capture = run_eavesdropper(*target, session, config=public, broker_cluster=opts.broker_cluster)
    serve_capture(capture, opts)


def capture_epochs(opts: EavesdropOptions, target: CaptureTarget, session: CaptureSession) -> None:
    """``nlagg eavesdrop --continuous``: every epoch of a deployment into one epoch store."""
    from adversary.capture import run_epoch_eavesdropper
    from adversary.epochs import epoch_summary

    from ..errors import ConfigError

    configs = None
    drift = None if opts.cold_start else opts.drift  # as the nodes of the plan warm-start (None: cold)
    if opts.config is not None:  # each epoch's config derived as the nodes derive it
        from adversary.capture.epochconfig import EpochConfigs

        from ..config import load_config
        from ..deploy.identities import run_identities

        keys = run_identities(Path(opts.config))
        configs = EpochConfigs(
            load_config(Path(opts.config)), drift, identities=None if keys is None else tuple(keys)
        )
    if opts.broker_cluster:
        raise ConfigError(
            "broker_cluster", True, "not with --continuous (it reads one broker in causal order)"
        )
    capture = run_epoch_eavesdropper(
        *target,
        session,
        summarize=epoch_summary,
        keep_epochs=opts.keep_epochs,
        epochs=opts.epochs,
        configs=configs,
        drift=drift,
    )
    serve_capture(capture, opts)


def serve_capture(capture: Coroutine[Any, Any, object], opts: EavesdropOptions) -> None:
    """Run a capture until it ends or a signal stops it, with its dashboard beside it when asked."""
    from ..lifetime import run_stoppable

    if opts.dashboard is None:
        run_stoppable(capture, partial=opts.transcript)
        return
    from adversary.reporting.dashboard import parse_listen, serve_beside

    try:
        parse_listen(opts.dashboard)  # a bad address fails before anything starts
    except BaseException:
        capture.close()
        raise
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    run_stoppable(serve_beside(opts.transcript, opts.dashboard, capture, say), partial=opts.transcript)
