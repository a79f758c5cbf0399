"""``Client.close()`` sends what was handed over before it closes the connection.

``await client.publish(...)`` returns once the PUBLISH is queued to send, and a consumer's
handler that returned has ACKed its item: a ``close()`` right after must not drop either (it
waits, at most ``CLOSE_FLUSH``, for the writer), or a publish is lost and an item that was
worked is given to another consumer again.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rubris_asgi import Rubris, Session
from rubris_asgi.client import Client, QueueItem

from .apps import starlette_app
from .server import run_server

TRANSPORTS = ("websocket", "longpoll")


def make() -> Rubris:
    rubris = Rubris(batches=False)

    @rubris.shared("news", ring=100, client_publish=True)
    async def news(session: Session) -> None:
        return None

    @rubris.queue("jobs", client_publish=True)
    async def jobs(session: Session) -> None:
        return None

    return rubris


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_publish_then_close_is_delivered(transport: str) -> None:
    rubris = make()
    async with run_server(starlette_app(rubris)) as base:
        got: list[Any] = []
        async with Client(base + "/rubris") as reader:
            await reader.subscribe("news", lambda value, info: got.append(value))
            writer = Client(base + "/rubris", transport=transport)  # type: ignore[arg-type]
            await writer.connect()
            for n in range(50):
                await writer.publish("news", {"n": n})
            await writer.close()  # at once: what publish() queued goes out first
            for _ in range(500):
                if len(got) == 50:
                    break
                await asyncio.sleep(0.01)
        assert got == [{"n": n} for n in range(50)]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_item_worked_then_close_is_acked_not_redelivered(transport: str) -> None:
    rubris = make()
    async with run_server(starlette_app(rubris)) as base:
        async with Client(base + "/rubris") as producer:
            await producer.enqueue("jobs", {"n": 1})
        worker = Client(base + "/rubris", transport=transport)  # type: ignore[arg-type]
        await worker.connect()
        done = asyncio.Event()

        async def work(item: QueueItem) -> None:
            done.set()  # returning ACKs it

        await worker.consume("jobs", work)
        await asyncio.wait_for(done.wait(), 10)
        await asyncio.sleep(0)  # the handler's return: its ACK is recorded
        await worker.close()
        for _ in range(500):
            stats = rubris.queue_stats("jobs")
            if stats.acked == 1:
                break
            await asyncio.sleep(0.01)
        assert (stats.acked, stats.waiting, stats.outstanding) == (1, 0, 0), stats
