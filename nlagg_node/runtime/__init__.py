"""The node runtime: wire protocol, transports, the async node, private brokers.

The names below are re-exported lazily (see :mod:`nlagg_node.lazy`): importing one submodule, such
as :mod:`~nlagg_node.runtime.wire` for the eavesdropper, does not load the node, the host or the
brokers with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .brokers import BrokerHandle as BrokerHandle
    from .brokers import free_port as free_port
    from .brokers import mosquitto_binary as mosquitto_binary
    from .brokers import start_amqtt as start_amqtt
    from .brokers import start_broker as start_broker
    from .brokers import start_mosquitto as start_mosquitto
    from .hosted import host_nodes as host_nodes
    from .member import MemberOptions as MemberOptions
    from .member import MemberSettings as MemberSettings
    from .member import Seat as Seat
    from .memory import MemoryBroker as MemoryBroker
    from .memory import MemoryTransport as MemoryTransport
    from .node import Node as Node
    from .node import NodeResult as NodeResult
    from .public import run_edges as run_edges
    from .transport import Message as Message
    from .transport import Transport as Transport
    from .transport import Will as Will
    from .wire import decode as decode
    from .wire import encode as encode
    from .wire import topics as topics

__all__, __getattr__ = lazy_exports(__name__, __file__)
