"""The node runtime: wire protocol, transports, the async node, private brokers, the testbed."""

from ..errors import BrokerError, WireError
from .brokers import (
    BrokerHandle,
    free_port,
    mosquitto_binary,
    start_amqtt,
    start_broker,
    start_mosquitto,
)
from .hosted import host_nodes
from .memory import MemoryBroker, MemoryTransport
from .node import NeighbourTimeoutError, Node, NodeResult, run_edges
from .transport import Message, Transport, Will
from .wire import decode, encode, topics

__all__ = [
    "BrokerError",
    "BrokerHandle",
    "MemoryBroker",
    "MemoryTransport",
    "Message",
    "NeighbourTimeoutError",
    "Node",
    "NodeResult",
    "Transport",
    "Will",
    "WireError",
    "decode",
    "encode",
    "free_port",
    "host_nodes",
    "mosquitto_binary",
    "run_edges",
    "start_amqtt",
    "start_broker",
    "start_mosquitto",
    "topics",
]
