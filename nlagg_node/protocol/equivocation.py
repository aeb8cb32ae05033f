"""Equivocation: two different messages of one sender for one slot are a protocol violation.

A slot is what a receiver takes once: ``x_j^(t)`` (sender j, iteration t, hence its phase) and
``z_{j|i}^(0)`` of a dual group (the edge and the group). The first value of a slot is the one a
receiver uses (:func:`~nlagg_node.protocol.accept.slot_verdict`); another one is a *conflict*.
Receivers that took different values would go on with different numbers, and no receiver can know
which one the others took, so a conflict ends the run: a node raises
:class:`~nlagg_node.errors.EquivocationError` with :func:`equivocation_error`'s line, and the transcript
stores the second message as rejected with the same line (the first one stays its truth).

In a run with identities (:mod:`nlagg_node.protocol.identity`) two z^(0), or two x's, both carry the
sender's signature: the pair is proof that the named node equivocated (a broker password alone
cannot sign). An x's signature is verified only when its slot conflicts (:func:`x_conflict_error`):
a second x whose signature fails is a copy (the key-chain element of the real one with another
number), refused as a forgery, and the run goes on. Without identities (a lab testbed) anyone with
the broker's password could have sent either; then the line names the slot's node as the one the
conflict is about, not as proven guilty.
"""

from __future__ import annotations

from ..errors import EquivocationError
from .identity import Verifier

__all__ = ["EquivocationError", "equivocation_error", "x_conflict_error"]


def equivocation_error(sender: int, what: str, signed: bool) -> EquivocationError:
    """The protocol violation of two different ``what`` (``x_3^(12)``, ``z0 3->5 (max)``) from ``sender``.

    ``signed``: both messages verified with the sender's identity (a run with identities).
    """
    if signed:
        why = f"node {sender} equivocated: two different {what}, both signed by its identity; the run stops"
    else:
        why = (
            f"two different {what} on node {sender}'s topic (equivocation: nothing proves which one"
            f" node {sender} sent); the run stops"
        )
    return EquivocationError(sender, why)


def x_conflict_error(
    verifier: Verifier | None, topic: str, sender: int, t: int, first: bytes | None, second: bytes
) -> EquivocationError | str:
    """What a second, different x_sender^(t) on ``topic`` is, ``first`` being the payload taken (None:
    no longer held): a forged copy (the reason it is refused, a str: its signature fails) or the
    sender's equivocation, proven when both signatures verify. The nodes and the transcript decide
    with this function; the signatures are verified here only, never for an x without a conflict."""
    what = f"x_{sender}^({t})"
    if verifier is None:
        return equivocation_error(sender, what, signed=False)
    why = verifier.check(topic, sender, second)
    if why is not None:
        return f"{what} conflicts with the one taken and is not node {sender}'s ({why}): a copy"
    proven = first is not None and verifier.check(topic, sender, first) is None
    return equivocation_error(sender, what, signed=proven)
