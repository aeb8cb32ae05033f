"""The node runtime: wire protocol, transports, the async node, private brokers, the testbed."""

from .brokers import (
    BrokerError,
    BrokerHandle,
    free_port,
    mosquitto_binary,
    start_amqtt,
    start_broker,
    start_mosquitto,
)

__all__ = [
    "BrokerError",
    "BrokerHandle",
    "free_port",
    "mosquitto_binary",
    "start_amqtt",
    "start_broker",
    "start_mosquitto",
]
