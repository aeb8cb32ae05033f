"""What ``nlagg deploy plan`` is asked for (:class:`PlanSpec`), apart from the plan it makes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config import DEFAULT_BROKER, RunConfig
from ..options import PlanRunOptions, option_fields
from ..valuesource import ValueSource
from .continuous import EpochTimetable
from .mosquitto_auth import TlsFiles

__all__ = ["DEFAULT_PREFIX", "PlanSpec", "plan_spec"]

DEFAULT_PREFIX = "nlagg"


@dataclass(frozen=True)
class PlanSpec:
    """What ``nlagg deploy plan`` is asked for.

    Attributes
    ----------
    run : the run's parameters (``graph`` may be random; it is drawn once here and frozen in graph.json).
    run_id, prefix : topic root ``prefix/run_id``.
    corrupt, corrupt_count : the corrupted ids (``"1,4"``) or the first K nodes (:func:`parse_corrupt`).
    seed : the run seed; None draws one from OS entropy (then nodes draw z^(0) from OS entropy too).
    replay : give every node file the run seed, so z^(0) replays the simulator (lab testbeds only).
    broker_url : what nodes and the eavesdropper connect to.
    listen_host, listen_port : the broker's listener (host None = every address).
    value_source : one source for every node (e.g. a sensor command); None = constants drawn from
        ``run.values`` with the seed (the simulator's trial-0 values).
    tls : server TLS files of your own (CA, certificate, key), off by default.
    make_tls : generate a private CA and the broker's certificate (``--tls``) instead.
    require_certificate : with TLS, also a client certificate per user, and the broker requires one.
    sites : K > 1 splits the graph into K site brokers bridged along the cut (see :mod:`.sites`).
    site_of : each node's site, given by hand (``--sites-file``); None partitions the graph.
    site_brokers : each site broker's URL; empty = ``broker_url``'s host with port + site number
        (site s then listens on ``listen_port + s``; otherwise on its URL's port).
    schedule : a continuous deployment's epochs (``--every``, :mod:`.continuous`); None: one run.
    auth : give every node an Ed25519 identity; its messages are signed (:mod:`.identities`).
    """

    run: RunConfig
    run_id: str
    prefix: str = DEFAULT_PREFIX
    corrupt: str | None = None
    corrupt_count: int | None = None
    seed: int | None = None
    replay: bool = False
    broker_url: str = DEFAULT_BROKER
    listen_host: str | None = None
    listen_port: int = 1883
    value_source: ValueSource | None = None
    tls: TlsFiles | None = None
    make_tls: bool = False
    require_certificate: bool = False
    sites: int = 1
    site_of: tuple[int, ...] | None = None
    site_brokers: tuple[str, ...] = ()
    schedule: EpochTimetable | None = None
    auth: bool = True

    @property
    def uses_tls(self) -> bool:
        return self.tls is not None or self.make_tls


def plan_spec(opts: PlanRunOptions, broker_url: str = DEFAULT_BROKER) -> PlanSpec:
    """The spec of ``nlagg deploy plan`` / ``compose`` options (errors name the option).

    Early stopping survives departures unless told otherwise: devices in the field may leave
    unannounced (docs/protocol.md). A ``--value-cmd`` sensor's declared range is the run's
    ``value_range`` unless one is given.
    """
    from ..valuesource import declared_range_of

    source = opts.value_source()
    run = opts.run_config(
        None,
        radius=opts.radius,
        value_range=opts.value_range if opts.value_range is not None else declared_range_of(source),
        early_stop=True if opts.early_stop is None else opts.early_stop,
        may_depart=True if opts.may_depart is None else opts.may_depart,
    )
    # The spec's fields that are run options of the same name (run_id, prefix, corrupt, seed...).
    options = option_fields(PlanRunOptions)
    same = {f.name: getattr(opts, f.name) for f in dataclasses.fields(PlanSpec) if f.name in options}
    return PlanSpec(run=run, broker_url=broker_url, value_source=source, **same)
