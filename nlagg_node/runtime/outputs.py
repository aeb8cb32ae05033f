"""The output series of a continuous deployment: one record per node and epoch, on the wire and on disk.

A node of a continuous deployment (prefix ``P``, run id ``R``) publishes the output of each epoch
it finished as :class:`EpochOutput`, retained, on ``P/R/results/{i}`` (:func:`results_topic`): the
latest epoch stays readable by a late subscriber (the operator's ``nlagg results``, the
eavesdropper). The output is public in the paper's model (every node holds it), so the topic holds
nothing private. In a deployment with identities the record is signed by its node and every reader
checks the signature (:func:`published_record`): one node's password forges no record, and one
node's whole bundle signs one record only, which the warm-start rule's quorum keeps from steering
(:func:`~nlagg_node.runtime.warmstart.published_output`). The node also appends each record to its local
results file, one JSON object a
line, 0600 (:func:`append_output`); :func:`read_outputs` reads such a file back.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ConfigError
from ..inputs import read_input_text
from ..limits import MAX_ITERATIONS
from ..private import open_private
from ..protocol.identity import Identity, Verifier, split_signed
from .wire import Finite, NodeId, check_prefix, check_run_id

__all__ = [
    "EpochOutput",
    "append_output",
    "epoch_run_id",
    "published_record",
    "read_outputs",
    "results_filter",
    "results_topic",
    "sign_record",
]


class EpochOutput(BaseModel):
    """Node ``node``'s output of epoch ``epoch`` (user units), after ``iterations``, at unix ``time``.

    ``output`` is one number, or the k values of a top-K run. The one definition of the record:
    the node writes it, ``nlagg results`` and the eavesdropper's capture
    (:mod:`adversary.capture.epochs`) validate what they read with it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = 1
    node: NodeId
    epoch: int = Field(ge=0)
    output: Finite | Annotated[list[Finite], Field(min_length=1)]
    iterations: int = Field(ge=0, le=MAX_ITERATIONS)
    time: Finite

    def encode(self) -> bytes:
        return self.model_dump_json().encode()


def epoch_run_id(epoch: int) -> str:
    """The run id of epoch ``epoch`` under the deployment's ``P/R`` prefix: ``e{k}``."""
    return check_run_id(f"e{epoch}")


def results_topic(prefix: str, run_id: str, node: int | str) -> str:
    """``P/R/results/{i}``: node i's latest :class:`EpochOutput`, retained."""
    return f"{check_prefix(prefix)}/{check_run_id(run_id)}/results/{node}"


def results_filter(prefix: str, run_id: str) -> str:
    """The filter of every node's results topic of a deployment."""
    return results_topic(prefix, run_id, "+")


def published_record(topic: str, payload: bytes, verifier: Verifier | None = None) -> EpochOutput:
    """The record published on node i's results topic ``P/R/results/{i}``, as every reader takes it
    (the nodes' warm starts, ``nlagg results``, the eavesdropper's capture). Raises ValueError
    (pydantic's ValidationError is one) for a payload that is not a record or is another node's.

    In a deployment with identities a node signs its record (:func:`sign_record`) and ``verifier``
    (the deployment's public keys) refuses one node i did not sign, named; a reader without the
    keys (``nlagg results`` without ``--config``) takes the record without its signature.
    """
    node = topic.rpartition("/")[2]
    if verifier is not None:
        if not node.isdigit():
            raise ValueError(f"{topic!r} is not a node's results topic")
        why = verifier.check(topic, int(node), payload)
        if why is not None:
            raise ValueError(why)
    parts = split_signed(payload)
    record = EpochOutput.model_validate_json(payload if parts is None else parts[0])
    if node != str(record.node):
        raise ValueError(f"node {record.node}'s record on the results topic of node {node!r}")
    return record


def sign_record(record: EpochOutput, topic: str, identity: Identity | None) -> bytes:
    """The payload of ``record`` on ``topic``: signed by the node's ``identity`` (none: unsigned)."""
    return record.encode() if identity is None else identity.sign(topic, record.encode())


def append_output(path: Path, record: EpochOutput) -> None:
    """Append ``record`` as one JSON line to the 0600 file ``path`` (created, with its folder, if missing)."""
    fd = open_private(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, record.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def read_outputs(path: Path) -> list[EpochOutput]:
    """The records of a results file; a line that is not one names the file and line (ConfigError)."""
    return list(_parse(str(path), read_input_text(path, "file").splitlines()))


def _parse(name: str, lines: Iterable[str]) -> Iterable[EpochOutput]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:  # pydantic's JSON parser bounds nesting (a deeply nested line is refused, no RecursionError)
            yield EpochOutput.model_validate_json(line)
        except ValidationError as exc:
            raise ConfigError(
                "file", f"{name}:{number}", f"not a result record ({_first_error(exc)})"
            ) from None


def _first_error(exc: ValidationError) -> str:
    """The first of a validation's errors, on one line: where it is and why."""
    first = exc.errors()[0]
    where = ".".join(map(str, first["loc"]))
    more = f" and {exc.error_count() - 1} more" if exc.error_count() > 1 else ""
    return f"{where + ': ' if where else ''}{first['msg']}{more}"
