"""The options of the network's clients, ``nlagg node`` and ``nlagg eavesdrop``: :func:`to_argv` writes
the command line that starts them (the testbed, the plans and the fault harness all use it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar

from ..defaults import DEFAULT_BROKER
from .epochs import DeploymentEpochOptions
from .opt import (
    ADVERSARY,
    CA_OPT,
    CERT_OPT,
    KEY_OPT,
    NETWORK,
    OUTPUT,
    QUIET_OPT,
    VALUES,
    VERBOSE_OPT,
    Needs,
    Opt,
)
from .run import ValueSourceOptions

__all__ = ["EavesdropOptions", "NodeOptions"]

_STORE = "an epoch store"


@dataclass(frozen=True, kw_only=True)
class _WhichNode:
    """Which node of which run: the first words of a node's command line."""

    id: Annotated[int, Opt("this node's id, 0..n-1", flags=("--id",), always=True)]
    config: Annotated[str, Opt("run config (TOML with [run] and optional [network], or JSON)", always=True)]


@dataclass(frozen=True, kw_only=True)
class NodeOptions(ValueSourceOptions, _WhichNode, DeploymentEpochOptions):
    """``nlagg node``: one node of a real run (:class:`_WhichNode`), its epochs
    (:class:`DeploymentEpochOptions`), its value (:class:`ValueSourceOptions`) and the rest.
    :func:`to_argv` writes its command line."""

    NEEDS: ClassVar[Needs] = (
        ("results_file", "every", "a continuous deployment"),
        ("leave_by", "leave_after", "the iteration to leave after"),
    )
    EXCLUDES: ClassVar[Needs] = (("leave_after", "every", "an absent node sits an epoch out"),)

    broker: Annotated[str, Opt("broker URL, mqtt://host[:port]", NETWORK, always=True)] = DEFAULT_BROKER
    run_id: Annotated[str | None, Opt("run id (default: [network].run_id of the config)", NETWORK)] = None
    prefix: Annotated[str | None, Opt("topic prefix (default: [network].prefix or nlagg)", NETWORK)] = None
    username: Annotated[str | None, Opt("broker user name", NETWORK)] = None
    password_file: Annotated[str | None, Opt("file holding the broker password", NETWORK)] = None
    neighbour_timeout: Annotated[float, Opt("seconds to wait at a barrier before failing")] = 60.0
    seed: Annotated[
        int | None, Opt("seed of this node's generator rng_for(seed,'node',0,id); OS entropy if unset")
    ] = None
    seed_file: Annotated[str | None, Opt("file whose first line is the seed (keeps it out of ps)")] = None
    state_dir: Annotated[
        str | None, Opt("keep a checkpoint here (before every publish); a restart resumes from it")
    ] = None
    ca_file: Annotated[str | None, CA_OPT] = None
    cert_file: Annotated[str | None, CERT_OPT] = None
    key_file: Annotated[str | None, KEY_OPT] = None
    signing_key: Annotated[
        str | None,
        Opt("this node's Ed25519 signing key (PEM, 0600) for a config with [identities]", NETWORK),
    ] = None
    leave_after: Annotated[
        int | None, Opt("publish x^(0)..x^(T-1), then leave the run (for tests)", min=1)
    ] = None
    leave_by: Annotated[
        str,
        Opt(
            "how --leave-after leaves: status (a clean 'leaving') or kill (SIGKILL itself once every"
            " neighbour holds its last x: the last will)",
            choices=("status", "kill"),
        ),
    ] = "status"
    as_json: Annotated[bool, Opt("print the result as one JSON object", OUTPUT, ("--json",))] = False
    corrupt: Annotated[
        bool, Opt("forward s_i and the duals to adv/{i}/state (passive adversary)", ADVERSARY, ("--corrupt",))
    ] = False
    value_range: Annotated[
        tuple[float, float] | None,
        Opt("public range LO HI of the values (overrides the config's value_range)", VALUES, metavar="LO HI"),
    ] = None
    startup_timeout: Annotated[float, Opt("seconds to wait for the neighbours to come online")] = 120.0
    departure_timeout: Annotated[
        float | None,
        Opt(
            "seconds a neighbour's last will must stay before it counts as departed for good "
            "(docs/protocol.md 'Nodes that leave') [default: 3/4 of --neighbour-timeout; with --every "
            "at most the period]"
        ),
    ] = None
    results_file: Annotated[
        str | None, Opt("with --every: append each epoch's output here (one JSON line, 0600)", OUTPUT)
    ] = None
    quiet: Annotated[bool, QUIET_OPT] = False
    verbose: Annotated[bool, VERBOSE_OPT] = False


@dataclass(frozen=True, kw_only=True)
class EavesdropOptions:
    """``nlagg eavesdrop``: capture a run. :func:`to_argv` writes its command line."""

    NEEDS: ClassVar[Needs] = (
        ("keep_epochs", "continuous", _STORE),
        ("epochs", "continuous", _STORE),
        ("drift", "continuous", _STORE),
        ("cold_start", "continuous", _STORE),
    )

    broker: Annotated[
        list[str] | None,
        Opt(
            "broker URL, mqtt://host[:port]; repeat it for every site broker of a run with sites"
            f" (one transcript, each message once) [default: {DEFAULT_BROKER}]",
            NETWORK,
        ),
    ] = None
    run_id: Annotated[str, Opt("the run to capture", NETWORK, always=True)]
    transcript: Annotated[
        Path,
        Opt(
            "the eavesdropper's SQLite transcript to write (created, or continued when it holds this run)",
            OUTPUT,
            always=True,
        ),
    ] = Path("transcript.sqlite")
    prefix: Annotated[str, Opt("topic prefix", NETWORK)] = "nlagg"
    username: Annotated[str | None, Opt("broker user name", NETWORK)] = None
    password_file: Annotated[str | None, Opt("file holding the broker password", NETWORK)] = None
    ca_file: Annotated[str | None, CA_OPT] = None
    cert_file: Annotated[str | None, CERT_OPT] = None
    key_file: Annotated[str | None, KEY_OPT] = None
    events: Annotated[
        bool, Opt("print JSON-line events (for a supervising process)", OUTPUT, ("--events/--no-events",))
    ] = False
    live: Annotated[
        bool | None,
        Opt("live view (default: when stdout is a terminal, unless --quiet)", OUTPUT, ("--live/--no-live",)),
    ] = None
    quiet: Annotated[bool, QUIET_OPT] = False
    verbose: Annotated[bool, VERBOSE_OPT] = False
    timeout: Annotated[float | None, Opt("stop after this many seconds")] = None
    config: Annotated[
        str | None, Opt("the run's config file, if the retained P/R/config is not published")
    ] = None
    broker_cluster: Annotated[
        bool,
        Opt(
            "the broker is a cluster (RabbitMQ, EMQX, VerneMQ) whose members may forward messages"
            " out of causal order: an x that overtook the x's it was computed from waits for them (5 s)",
            NETWORK,
        ),
    ] = False
    dashboard: Annotated[
        str | None,
        Opt(
            "serve the live dashboard at :PORT or HOST:PORT (loopback unless a host is given);"
            " it keeps serving the finished capture until Ctrl-C",
            OUTPUT,
        ),
    ] = None
    continuous: Annotated[
        bool,
        Opt(
            "capture every epoch of a continuous deployment (topics P/R/e{k}/..., statuses and keys"
            " P/R/node/{i}/..., results P/R/results/{i})"
            " into an epoch store: --transcript names its folder",
            NETWORK,
            ("--continuous/--no-continuous",),
        ),
    ] = False
    keep_epochs: Annotated[
        int | None,
        Opt(
            "--continuous: keep the raw transcripts of the newest N closed epochs only (the others'"
            " summaries stay) [default: all]",
            OUTPUT,
            min=0,
        ),
    ] = None
    epochs: Annotated[
        int | None,
        Opt("--continuous: stop once the store holds this many closed epochs", min=1),
    ] = None
    drift: Annotated[
        float | None,
        Opt(
            "--continuous: the deployment's declared drift (its plan's --drift): each epoch's"
            " configuration is derived as the nodes derive it, from --config or the deployment's"
            " retained P/R/config [default: 0]",
            min=0.0,
        ),
    ] = None
    cold_start: Annotated[
        bool,
        Opt(
            "--continuous: the deployment runs every epoch cold (its plan's --cold-start)",
            flags=("--cold-start",),
        ),
    ] = False
