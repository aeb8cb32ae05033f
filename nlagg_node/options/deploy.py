"""The options of ``nlagg deploy plan`` and ``nlagg deploy compose`` (both write a plan)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar

from ..defaults import DEFAULT_BROKER
from .epochs import DeploymentEpochOptions
from .opt import FORCE_OPT, GRAPH, NETWORK, OUTPUT, RUN, STOPPING, VALUES, Needs, Opt, option_fields
from .run import CorruptOptions, ModelOptions, ValueSourceOptions

__all__ = ["ComposeOptions", "PlanOptions", "PlanRunOptions"]


@dataclass(frozen=True, kw_only=True)
class PlanRunOptions(ModelOptions, CorruptOptions, ValueSourceOptions):
    """The run options of ``deploy plan`` and ``deploy compose`` (both write a plan)."""

    run_id: Annotated[str, Opt("run id R (topics P/R/...): 1-64 of [A-Za-z0-9_-]", NETWORK)]
    radius: Annotated[float | None, Opt("rgg connection radius (default: connectivity)", GRAPH)] = None
    seed: Annotated[
        int | None, Opt("run seed for graph and values [default: drawn from OS entropy]", RUN)
    ] = None
    replay: Annotated[bool, Opt("give nodes the run seed so z^(0) replays the simulator (lab only)", RUN)] = (
        False
    )
    prefix: Annotated[str, Opt("topic prefix P", NETWORK)] = "nlagg"
    may_depart: Annotated[
        bool | None,
        Opt(
            "devices may leave for good: the early stop waits n - 1 hops and survives departures; off: the"
            " graph's diameter, and a departure fails the run (docs/protocol.md) [default: on]",
            STOPPING,
            ("--may-depart/--no-may-depart",),
        ),
    ] = None
    value_range: Annotated[
        tuple[float, float] | None,
        Opt(
            "public range LO HI of the values (default: what the --value-cmd sensor declares)",
            VALUES,
            metavar="LO HI",
        ),
    ] = None
    auth: Annotated[
        bool,
        Opt(
            "give every node an Ed25519 identity and authenticate every message (a broker password"
            " alone then forges nothing; docs/protocol.md 'Signed messages') [default: on]",
            NETWORK,
            ("--auth/--no-auth",),
        ),
    ] = True
    force: Annotated[bool, FORCE_OPT] = False


TLS_OPT = Opt(
    "generate a private CA and the broker's certificate; a TLS-only listener (bridges too)", NETWORK
)
REQUIRE_CERTIFICATE_OPT = Opt("with --tls: a client certificate per user, required by the broker", NETWORK)


@dataclass(frozen=True, kw_only=True)
class PlanOptions(PlanRunOptions, DeploymentEpochOptions):
    """``nlagg deploy plan``."""

    out: Annotated[Path, Opt("directory to write the plan into", OUTPUT)]
    broker: Annotated[
        str | None,
        Opt(
            "broker URL the nodes and the eavesdropper connect to (with --tls: mqtts://127.0.0.1:8883)"
            f" [default: {DEFAULT_BROKER}]",
            NETWORK,
        ),
    ] = None
    listen: Annotated[
        str | None,
        Opt("broker listener: PORT or HOST:PORT (PORT = every address; 1883, with --tls 8883)", NETWORK),
    ] = None
    tls: Annotated[bool, TLS_OPT] = False
    require_certificate: Annotated[bool, REQUIRE_CERTIFICATE_OPT] = False
    tls_cafile: Annotated[str | None, Opt("broker TLS: CA certificate (PEM)", NETWORK)] = None
    tls_certfile: Annotated[str | None, Opt("broker TLS: server certificate (PEM)", NETWORK)] = None
    tls_keyfile: Annotated[str | None, Opt("broker TLS: server key (PEM)", NETWORK)] = None
    sites: Annotated[
        int,
        Opt(
            "K site brokers: the graph split into K balanced parts with few cut edges, the brokers"
            " bridged along the cut (docs/cli.md, 'deploy plan')",
            NETWORK,
        ),
    ] = 1
    sites_file: Annotated[
        Path | None, Opt("assign nodes to sites by hand: JSON [[ids of site 0], [site 1], ...]", NETWORK)
    ] = None
    site_broker: Annotated[
        list[str] | None,
        Opt("URL of each site's broker, in site order (default: --broker's host, its port + site)", NETWORK),
    ] = None


@dataclass(frozen=True, kw_only=True)
class ComposeOptions(PlanRunOptions):
    """``nlagg deploy compose``."""

    EXCLUDES: ClassVar[Needs] = (
        *((name, "plan", "the plan sets it") for name in option_fields(PlanRunOptions) if name != "force"),
        ("plan_dir", "plan", "it names where a fresh plan goes"),
        ("tls", "plan", "an existing plan brings its own TLS"),
        ("require_certificate", "plan", "an existing plan brings its own TLS"),
        ("compose_dir", "out", "it says where a printed compose file will live"),
    )
    NEEDS: ClassVar[Needs] = (("compose_dir", "plan", "an existing plan whose compose file is printed"),)

    run_id: Annotated[str, Opt("run id R (topics P/R/...): 1-64 of [A-Za-z0-9_-]", NETWORK)] = "testbed"
    n: Annotated[int | None, Opt("number of nodes", GRAPH)] = 6
    out: Annotated[
        Path | None,
        Opt(
            "write docker-compose.yml, .env and a fresh plan here (default: . ; with --plan: stdout)", OUTPUT
        ),
    ] = None
    plan: Annotated[
        Path | None, Opt("use this existing plan (nlagg deploy plan) instead of a fresh one", RUN)
    ] = None
    plan_dir: Annotated[
        Path, Opt("where the fresh plan goes, relative to --out (gitignored by a .gitignore)", OUTPUT)
    ] = Path("plan")
    compose_dir: Annotated[
        Path | None, Opt("with --plan and no --out: where the printed file will live", OUTPUT)
    ] = None
    tls: Annotated[bool, TLS_OPT] = False
    require_certificate: Annotated[bool, REQUIRE_CERTIFICATE_OPT] = False
