"""What every node of one run builds alike: its shape and its public config document.

Both follow from the run's configuration, edges, identities and instance alone, and cost O(n + |E|)
each (the neighbour lists, the schedule, the edge list of the config message). A lone node builds
them once; a host of many nodes (:func:`~nlagg_node.runtime.hosted.host_nodes`) builds them once
for all of them and hands them to each (``parts`` of
:class:`~nlagg_node.runtime.member.MemberSettings`): at n = 1000 building them per node took
118 ms a node (two minutes for the network, with the event loop blocked and 4 GB held).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..config import RunConfig
from ..errors import NlaggError
from ..graphs import IntArray
from ..protocol import RunShape
from .public import build_config_msg
from .wire import ConfigMsg

__all__ = ["RunParts"]


@dataclass(frozen=True, eq=False)
class RunParts:
    """The shape (:class:`~nlagg_node.protocol.RunShape`) and the public ``config`` document of a run."""

    shape: RunShape
    public: ConfigMsg

    @classmethod
    def of(
        cls,
        cfg: RunConfig,
        run_id: str,
        edges: IntArray,
        identities: Sequence[str] | None = None,
        *,
        instance: str | None = None,
    ) -> RunParts:
        """Build them for ``cfg`` (resolved here) and the run's ``edges``, ``identities`` and ``instance``."""
        cfg = cfg.resolved()
        public = build_config_msg(cfg, run_id, edges, identities, instance=instance)
        return cls(RunShape(cfg, edges), public)

    def check_fits(
        self,
        cfg: RunConfig,
        run_id: str,
        edges: IntArray,
        identities: Sequence[str] | None,
        instance: str | None,
    ) -> None:
        """Raise :class:`~nlagg_node.errors.NlaggError` unless these parts are the ones :meth:`of`
        builds for this run (a host handing one node another run's parts)."""
        public = self.public
        keys = None if identities is None else list(identities)
        same = (
            self.shape.cfg == cfg
            and public.run_id == run_id
            and public.instance == instance
            and public.identities == keys
            and (self.shape.edges is edges or np.array_equal(self.shape.edges, edges))
        )
        if not same:
            raise NlaggError(
                f"parts: built for another run than {run_id!r} (its config, edges or identities)"
            )
