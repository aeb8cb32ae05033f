"""``nlagg deploy plan --every S``: a continuous deployment (docs/continuous.md).

One plan, one bundle per device, no restart between epochs: the node files carry the schedule
(``every``, ``epochs``, ``origin``), and the broker's ACL covers every epoch. Epoch k's x and z^(0)
topics are those of the single run ``P/R/e{k}`` (:mod:`nlagg_node.runtime.epochdriver`), so the ACL of
one run is rewritten with a ``+`` wildcard at the epoch level (``topic write P/R/+/node/3/x``); its
status and key go on the topics every epoch shares, ``P/R/node/{i}/status`` and ``P/R/node/{i}/key``
(:class:`~nlagg_node.runtime.wire.topics`), granted as such; and each node may write its results
topic ``P/R/results/{i}``, which the operator (the launcher user), the eavesdropper and the other
nodes read.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ..errors import ConfigError
from ..runtime.outputs import epoch_run_id, results_filter, results_topic
from ..runtime.wire import WireError, parse_topic, topics
from .mosquitto_auth import node_user
from .nodefile import NodeFile

__all__ = ["EpochTimetable", "continuous_acl", "schedule_of", "scheduled"]

ORIGIN_LEAD = 60.0
"""A plan's default origin: the first whole minute at least this many seconds after planning."""


@dataclass(frozen=True)
class EpochTimetable:
    """When a continuous deployment's epochs start, ``origin + k * every`` for k < ``epochs``, and how (warm
    starts' drift, cold start). Not the phase schedule of one run (:class:`nlagg_node.schedule.Schedule`)."""

    every: float
    origin: float
    epochs: int | None = None
    drift: float | None = None  # warm starts (docs/continuous.md); None: 0
    cold_start: bool = False


def schedule_of(
    every: float | None,
    epochs: int | None,
    origin: float | None,
    drift: float | None = None,
    cold_start: bool = False,
) -> EpochTimetable | None:
    """The schedule of ``--every/--epochs/--origin`` and the warm starts' ``--drift/--cold-start``
    (None without ``--every``); errors name the option."""
    if every is None:
        for field, value in (("epochs", epochs), ("origin", origin), ("drift", drift)):
            if value is not None:
                raise ConfigError(field, value, "needs --every (a continuous deployment)")
        return None
    if not (math.isfinite(every) and every > 0):
        raise ConfigError("every", every, "must be a positive number of seconds")
    if origin is None:
        origin = math.ceil((time.time() + ORIGIN_LEAD) / 60.0) * 60.0
    return EpochTimetable(every, origin, epochs, drift, cold_start)


def scheduled(nodes: list[NodeFile], schedule: EpochTimetable | None) -> list[NodeFile]:
    """The node files with the schedule written in (unchanged without one)."""
    if schedule is None:
        return nodes
    fields = {"every": schedule.every, "epochs": schedule.epochs, "origin": schedule.origin}
    fields |= {"drift": schedule.drift, "cold_start": schedule.cold_start}
    return [node.model_copy(update=fields) for node in nodes]


def continuous_acl(acl: str, prefix: str, run_id: str, n: int, operator: str) -> str:
    """The ACL of one run (``acl_text``) made to cover every epoch of the deployment.

    Every grant under ``P/R/`` moves under ``P/R/+/`` (any epoch), but a read of all of ``P/R/#``
    (the eavesdropper's) stays, and so does a grant of ``P/R/config`` (the launcher still publishes
    the deployment's config there: the compose testbed's eavesdropper waits for it); a grant of a
    status or key topic becomes that of the topic every epoch shares (node i writes its own, reads
    its neighbours'); node i also writes ``P/R/results/{i}`` and reads every node's (a node that
    missed an epoch warm-starts the next from the outputs published,
    :mod:`~nlagg_node.runtime.warmstart`), as ``operator`` does.
    """
    root = f"{prefix}/{run_id}/"
    nodes = {node_user(i): i for i in range(n)}
    lines = []
    for line in acl.splitlines():
        kind, _, rest = line.partition(" ")
        if line.endswith(f"{root}config"):  # the deployment's own config too (the launcher's, compose)
            lines.append(line)
        if kind == "topic" and root in line and not line.endswith(f"{root}#"):
            access, _, topic = rest.partition(" ")
            shared = _shared_topic(topic, prefix, run_id)
            line = f"topic {access} {shared}" if shared else line.replace(root, f"{root}+/", 1)
        lines.append(line)
        if kind == "user" and rest == operator:
            lines.append(f"topic read {results_filter(prefix, run_id)}")
        elif kind == "user" and rest in nodes:  # it reads the others' to warm-start after a miss
            lines.append(f"topic write {results_topic(prefix, run_id, nodes[rest])}")
            lines.append(f"topic read {results_filter(prefix, run_id)}")
    return "\n".join(lines) + "\n"


def _shared_topic(topic: str, prefix: str, run_id: str) -> str | None:
    """The topic every epoch shares for a status or key topic of the single run ``prefix/run_id``
    (None for any other topic)."""
    try:
        info = parse_topic(topic, prefix, run_id)
    except WireError:
        return None
    if info.kind not in ("status", "key") or info.node is None:
        return None
    shared = topics(f"{prefix}/{run_id}", epoch_run_id(0), shared=True)  # every epoch's alike
    return shared.status(info.node) if info.kind == "status" else shared.key(info.node)
