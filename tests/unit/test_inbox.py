"""The one inbox of the MQTT readers: order, wake-up, the end and the error of a reader that gives up."""

from __future__ import annotations

import asyncio

import pytest

from nlagg_node.errors import NlaggError
from nlagg_node.runtime.transport import Inbox


async def test_a_waiting_consumer_gets_every_item_in_order_then_the_end() -> None:
    inbox: Inbox[int] = Inbox()
    ended = False
    got: list[int] = []

    async def consume() -> None:
        async for item in inbox.drain(lambda: ended):
            got.append(item)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)  # the consumer now waits on an empty inbox
    inbox.put(1)
    inbox.items.extend([2, 3])  # a callback's batch, one wake-up for all
    inbox.wake()
    await asyncio.sleep(0)
    assert got == [1, 2, 3]
    assert not task.done()
    ended = True
    inbox.wake()
    async with asyncio.timeout(1):
        await task
    assert len(inbox) == 0


async def test_the_error_of_a_reader_that_gave_up_comes_after_what_it_had_received() -> None:
    inbox: Inbox[str] = Inbox()
    inbox.put("a")
    inbox.fail(NlaggError("first"))
    inbox.fail(NlaggError("second"))
    inbox.put("b")
    got: list[str] = []

    async def consume() -> None:
        async for item in inbox.drain(lambda: True):
            got.append(item)

    with pytest.raises(NlaggError, match="first"):
        await consume()
    assert got == ["a", "b"]
