"""Work queues with consumers 50 ms away (tests/delaykit.py), the defaults on both sides.

The source document's network: every byte between a consumer and the server is held 50 ms
each way, so the client's buffer, its CoDel and the server's REVOKEs all see the round trip.
Measured before issue 26, with one consumer at 40 ms an item and prefetch 51: 3-4 items of 200
were run twice, none with the client's CoDel off: the client gave back from the head of its
buffer while the server revoked from the tail, and a REVOKE on its way named the item the
client had just taken. Now both take back the newest, and the server only what the consumer
cannot have started by the time the REVOKE reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from rubris_asgi import Rubris, Session
from rubris_asgi.client import Client, QueueItem

from .apps import starlette_app
from .delaykit import DelayLine
from .server import run_server

DELAY = 0.050


@contextlib.asynccontextmanager
async def far(n: int, **settings: Any) -> AsyncIterator[tuple[Rubris, list[str]]]:
    """A node with the queue ``jobs`` and ``n`` addresses of it, each behind its own 50 ms
    delay line."""
    rubris = Rubris()

    @rubris.queue("jobs", **settings)
    async def jobs(session: Session) -> None:
        return None

    async with run_server(starlette_app(rubris)) as base:
        port = urlsplit(base).port
        assert port is not None
        lines = [DelayLine(port, DELAY) for _ in range(n)]
        try:
            urls = [f"http://127.0.0.1:{await line.start()}/rubris" for line in lines]
            yield rubris, urls
        finally:
            for line in lines:
                await line.close()


async def each_once(rubris: Rubris, done: Counter[int], n: int, timeout: float) -> Any:
    """Wait until the queue acknowledged ``n`` items; each of 0..n-1 was done (their repeats
    are the caller's to check, with what it knows to show)."""
    for _ in range(int(timeout / 0.01)):
        if rubris.queue_stats("jobs").acked == n:
            break
        await asyncio.sleep(0.01)
    st = rubris.queue_stats("jobs")
    assert st.acked == n, st
    assert sorted(done) == list(range(n))
    return st


async def work(client: Client, seconds: list[float], done: Counter[int]) -> None:
    """Consume ``jobs`` with the defaults; ``seconds[0]`` per item (it may change)."""

    async def handle(item: QueueItem) -> None:
        await asyncio.sleep(seconds[0])
        done[item.value] += 1

    await client.consume("jobs", handle)


@pytest.mark.slow
async def test_one_slow_consumer_far_away_runs_each_item_once() -> None:
    n = 200
    done: Counter[int] = Counter()
    async with far(1, prefetch=51) as (rubris, [url]), Client(url) as client:
        await work(client, [0.040], done)
        for i in range(n):
            rubris.enqueue("jobs", i)
        st = await each_once(rubris, done, n, 20.0)
        assert [i for i, k in done.items() if k > 1] == [], (st, client.stats)


@pytest.mark.slow
async def test_a_consumer_that_slows_down_sheds_to_the_others_and_nothing_runs_twice() -> None:
    """Three consumers 50 ms away at 4 ms an item; one slows to 40 ms: what waits in it goes
    to the others (client CoDel give-backs, server REVOKEs), each item is run once."""
    n = 3000
    done: Counter[int] = Counter()
    speeds = [[0.004], [0.004], [0.004]]
    async with far(3) as (rubris, urls), contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(Client(u)) for u in urls]
        for c, s in zip(clients, speeds, strict=True):
            await work(c, s, done)

        async def produce() -> None:  # a standing backlog of about 20 items
            i = 0
            while i < n:
                room = max(0, 20 - rubris.queue_stats("jobs").waiting)
                for _ in range(min(room, n - i)):
                    rubris.enqueue("jobs", i)
                    i += 1
                await asyncio.sleep(0.001)

        producer = asyncio.create_task(produce())
        await asyncio.sleep(1.5)
        speeds[0][0] = 0.040
        await producer
        st = await each_once(rubris, done, n, 30.0)
        shed = st.revoked + sum(c.stats.codel_returned for c in clients)
        assert shed > 0, st  # the slow one's standing queue went to the others
        assert [i for i, k in done.items() if k > 1] == [], (st, [c.stats for c in clients])
