"""Equivocation: two different messages of one sender for one slot are a protocol violation.

A slot is what a receiver takes once: ``x_j^(t)`` (sender j, iteration t, hence its phase) and
``z_{j|i}^(0)`` of a dual group (the edge and the group). The first value of a slot is the one a
receiver uses (:func:`~nlagg_node.protocol.accept.slot_verdict`); another one is a *conflict*.
Receivers that took different values would go on with different numbers, and no receiver can know
which one the others took, so a conflict ends the run: a node raises
:class:`~nlagg_node.errors.EquivocationError` with :func:`equivocation_error`'s line, and the transcript
stores the second message as rejected with the same line (the first one stays its truth).

In a run with identities (:mod:`nlagg_node.protocol.identity`) two z^(0) both carry the sender's
signature: the pair is proof that the named node equivocated (a broker password alone cannot sign).
Two x's carry a key-chain element (:mod:`nlagg_node.protocol.chain`), which a copy made after the
real x shares; and without identities (a lab testbed) anyone with the broker's password could have
sent either. Then the line names the slot's node as the one the conflict is about, not as proven
guilty.
"""

from __future__ import annotations

from ..errors import EquivocationError

__all__ = ["EquivocationError", "equivocation_error"]


def equivocation_error(sender: int, what: str, signed: bool) -> EquivocationError:
    """The protocol violation of two different ``what`` (``x_3^(12)``, ``z0 3->5 (max)``) from ``sender``.

    ``signed``: both messages verified with the sender's identity (a run with identities; x's carry
    a key-chain element instead, which does not make a pair a proof: :mod:`.chain`).
    """
    if signed:
        why = f"node {sender} equivocated: two different {what}, both signed by its identity; the run stops"
    else:
        why = (
            f"two different {what} on node {sender}'s topic (equivocation: nothing proves which one"
            f" node {sender} sent); the run stops"
        )
    return EquivocationError(sender, why)
