"""Shared fixtures: private brokers on loopback (a real Mosquitto, the embedded amqtt broker).

Skips come from markers (declared in pyproject.toml): a test marked ``mosquitto``, ``netns``, ``docker``
or ``browser`` is skipped, with the reason and what to install, where that need is not met. A test that
uses the ``mosquitto_url`` or ``mosquitto_broker`` fixture is marked ``mosquitto`` by itself.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from nlagg_node.runtime.brokers import BrokerHandle, mosquitto_binary, start_amqtt, start_mosquitto
from tests.harness import docker_engine, netns

CHROMIUM = Path("/usr/bin/chromium")  # Debian's; Playwright drives it (no ``playwright install``)
MOSQUITTO_FIXTURES = frozenset({"mosquitto_url", "mosquitto_broker"})


def _no_mosquitto() -> str | None:
    if mosquitto_binary() is None:
        return "mosquitto binary not installed (apt-get install mosquitto)"
    return None


def _no_browser() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (pip install playwright)"
    return None if CHROMIUM.exists() else "Debian's chromium is not installed (apt-get install chromium)"


# Why a marker's need is not met here, or None; each asked once per session, and only when a test
# with that marker is about to run (the netns probe creates a namespace).
UNMET: dict[str, Callable[[], str | None]] = {
    "mosquitto": functools.cache(_no_mosquitto),
    "netns": functools.cache(netns.unavailable),
    "docker": functools.cache(docker_engine.unavailable),
    "browser": functools.cache(_no_browser),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that start a Mosquitto through a fixture ``mosquitto``."""
    for item in items:
        if MOSQUITTO_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.mosquitto)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a marked test whose need is not met, before its fixtures start anything."""
    for marker, unmet in UNMET.items():
        if item.get_closest_marker(marker) is not None and (why := unmet()) is not None:
            pytest.skip(f"{marker}: {why}")


@pytest.fixture
async def mosquitto_url() -> AsyncIterator[str]:
    """``mqtt://127.0.0.1:PORT`` of a private Mosquitto (set_tcp_nodelay true) started for the test."""
    async with start_mosquitto() as broker:
        yield broker.url


@pytest.fixture
async def mosquitto_broker() -> AsyncIterator[BrokerHandle]:
    """The :class:`BrokerHandle` of a private Mosquitto (for tests that read its log or config)."""
    async with start_mosquitto() as broker:
        yield broker


@pytest.fixture
async def amqtt_url() -> AsyncIterator[str]:
    """``mqtt://127.0.0.1:PORT`` of an embedded amqtt broker running in the test's event loop."""
    async with start_amqtt() as broker:
        yield broker.url


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line naming each group of skipped tests, how many, and why (what to install)."""
    groups: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        groups[reason] = groups.get(reason, 0) + 1
    if groups:
        listed = "; ".join(f"{count} x {reason}" for reason, count in sorted(groups.items()))
        terminalreporter.write_line(f"skipped groups: {listed}")
