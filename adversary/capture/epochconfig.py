"""Each epoch's public configuration, derived as the nodes derive it (docs/continuous.md).

A continuous deployment publishes no per-epoch ``P/R/e{k}/config``: every node derives the
configuration of epoch k from public facts, the deployment's config (the plan's ``run.toml``),
the epoch, epoch k-1's public output and the declared drift
(:func:`nlagg_node.runtime.warmstart.epoch_config`). The continuous capture
(:mod:`adversary.capture.epochs`) derives the same from the same facts and gives it to each
epoch's eavesdropper, so that the transcript judges and replays the epoch as the nodes ran it.

Which epochs run warm mirrors the nodes' rule: a node runs epoch k warm when it holds k-1's
output, and one that does not sits k out. The capture holds k-1's output when a node published
it on ``P/R/results/{i}``; the warm ``c`` does not depend on its value, so outputs that differ
within the run's tolerance give one configuration. With no published output of k-1 (no node
finished it: every node sat it out or none was there), the nodes run k cold, and so does the
derived configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nlagg_node.arrays import IntArray
from nlagg_node.config import RunConfig
from nlagg_node.runtime.epochs import rerun_run_id
from nlagg_node.runtime.outputs import epoch_run_id
from nlagg_node.runtime.public import build_config_msg, run_edges
from nlagg_node.runtime.warmstart import HeardOutput, epoch_config
from nlagg_node.runtime.wire import ConfigMsg

__all__ = ["EpochConfigs"]


@dataclass(frozen=True)
class EpochConfigs:
    """The deployment's public ``cfg`` and declared ``drift`` (None: every epoch cold,
    ``--cold-start``), from which every epoch's :class:`ConfigMsg` follows."""

    cfg: RunConfig
    drift: float | None
    edges: IntArray = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "edges", run_edges(self.cfg))  # the graph every node draws

    def message(self, epoch: int, previous: float | None, *, rerun: bool = False) -> ConfigMsg:
        """The public configuration of epoch ``epoch`` (``rerun``: of its cold rerun), given epoch
        k-1's published output ``previous`` (None: none was published)."""
        held = HeardOutput(epoch - 1, previous) if epoch > 0 else None
        run_cfg = epoch_config(self.cfg, epoch, held, self.drift, rerun=rerun)
        run = rerun_run_id(epoch) if rerun else epoch_run_id(epoch)
        return build_config_msg(run_cfg, run, self.edges)
