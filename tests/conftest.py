"""Shared fixtures: private brokers on loopback (a real Mosquitto, the embedded amqtt broker)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from nlagg_node.runtime.brokers import BrokerHandle, mosquitto_binary, start_amqtt, start_mosquitto


@pytest.fixture
async def mosquitto_url() -> AsyncIterator[str]:
    """``mqtt://127.0.0.1:PORT`` of a private Mosquitto (set_tcp_nodelay true) started for the test."""
    if mosquitto_binary() is None:
        pytest.skip("mosquitto binary not installed (apt-get install mosquitto)")
    async with start_mosquitto() as broker:
        yield broker.url


@pytest.fixture
async def mosquitto_broker() -> AsyncIterator[BrokerHandle]:
    """The :class:`BrokerHandle` of a private Mosquitto (for tests that read its log or config)."""
    if mosquitto_binary() is None:
        pytest.skip("mosquitto binary not installed (apt-get install mosquitto)")
    async with start_mosquitto() as broker:
        yield broker


@pytest.fixture
async def amqtt_url() -> AsyncIterator[str]:
    """``mqtt://127.0.0.1:PORT`` of an embedded amqtt broker running in the test's event loop."""
    async with start_amqtt() as broker:
        yield broker.url
