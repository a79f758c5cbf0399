"""``Client.watch_batch`` (rubris_asgi.client.batches) against a real server (protocol.md 8c).

A real uvicorn serves tests/apps.py's app with batch tracking in memory and a queue channel; the
test opens a batch, enqueues one work item per batch item (``batch_item``), and two Python
consumers work them while a third client watches ``batch.{id}`` to the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from rubris_asgi import Rubris, Session
from rubris_asgi.batches import MemoryBatchStore
from rubris_asgi.client import Client, QueueItem, SubscribeRejected, watch_batch
from rubris_asgi.config import BatchConfig, Config, Timing
from rubris_asgi.errors import ErrorCode

from .apps import make_rubris, starlette_app
from .server import run_server
from .wirekit import until

TRANSPORTS = ["websocket", "longpoll"]
N = 24


def batch_rubris(**overrides: Any) -> Rubris:
    """tests/apps.py's app with batches in memory and the queue channel ``jobs.{kind}``."""
    rubris = make_rubris(batches=MemoryBatchStore(), **overrides)

    @rubris.queue("jobs.{kind}", codel_target=None)
    async def jobs(session: Session, kind: str) -> None:
        return None

    return rubris


@asynccontextmanager
async def served(rubris: Rubris) -> AsyncIterator[str]:
    async with run_server(starlette_app(rubris)) as base:
        yield base + "/rubris"


def watched(rubris: Rubris, batch: str) -> bool:
    return rubris.has_subscribers(f"batch.{batch}")


def final(total: int, done: int, failed: int = 0) -> dict[str, Any]:
    return {"state": "complete", "total": total, "done": done, "failed": failed, "completed": True}


def without_completed(state: dict[str, Any]) -> dict[str, Any]:
    """A final state seen after the fact: ``completed`` is True when the watcher got the topic's
    stored completion push, False when the server read the state from the store (no topic)."""
    return {k: v for k, v in state.items() if k != "completed"}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_watcher_sees_two_consumers_complete_the_batch(transport: str) -> None:
    rubris = batch_rubris()
    async with served(rubris) as url:
        async with (
            Client(url, transport=transport) as c1,  # type: ignore[arg-type]
            Client(url, transport=transport) as c2,  # type: ignore[arg-type]
            Client(url, transport=transport) as watcher,  # type: ignore[arg-type]
        ):
            batch = await rubris.batches.open()
            group = await rubris.batches.add(batch, N)
            for item in group.ids():
                rubris.enqueue("jobs.batch", {"item": item}, batch_item=item)

            updates: list[dict[str, Any]] = []

            async def on_update(state: dict[str, Any]) -> None:  # an async one is awaited
                updates.append(state)

            watching = asyncio.create_task(
                watcher.watch_batch(batch, on_update=on_update, timeout=8)
            )
            await until(lambda: len(updates) >= 1)
            first = {"state": "open", "total": N, "done": 0, "failed": 0, "completed": False}
            assert updates == [first]
            sealed = await rubris.batches.seal(batch)
            assert sealed.state.value == "sealed"
            await until(lambda: updates[-1]["state"] == "sealed")

            worked: dict[str, list[str]] = {"c1": [], "c2": []}

            def worker(name: str) -> Any:
                async def handle(item: QueueItem) -> None:
                    await asyncio.sleep(0.01)  # slow enough for progress to show
                    worked[name].append(item.value["item"])

                return handle

            k1 = await c1.consume("jobs.batch", worker("c1"), prefetch=2)
            k2 = await c2.consume("jobs.batch", worker("c2"), prefetch=2)

            result = await asyncio.wait_for(watching, 9)
            assert result == final(N, N)
            assert updates[-1] == result
            assert sorted(worked["c1"] + worked["c2"]) == sorted(group.ids())
            assert worked["c1"] and worked["c2"]  # both consumers took a share
            progress = [u["done"] for u in updates if u["state"] == "sealed"]
            assert any(0 < d < N for d in progress), updates  # progress on the way
            assert [u["done"] for u in updates] == sorted(u["done"] for u in updates)
            assert sum(u["completed"] for u in updates) == 1
            await until(lambda: not watched(rubris, batch))  # let go

            # a late watcher gets the final state at once
            late: list[dict[str, Any]] = []
            again = await watcher.watch_batch(batch, on_update=late.append, timeout=2)
            assert again == late[0] and len(late) == 1
            assert again == {
                "state": "complete",
                "total": N,
                "done": N,
                "failed": 0,
                "completed": True,
            }
            assert without_completed(again) == without_completed(final(N, N))
            await until(lambda: not watched(rubris, batch))
            await k1.close()
            await k2.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_unknown_batch_is_rejected_with_code_3(transport: str) -> None:
    rubris = batch_rubris()
    async with served(rubris) as url:
        async with Client(url, transport=transport) as client:  # type: ignore[arg-type]
            seen: list[dict[str, Any]] = []
            with pytest.raises(SubscribeRejected) as caught:
                await client.watch_batch("nosuchbatch", on_update=seen.append, timeout=5)
            assert caught.value.code == ErrorCode.UNKNOWN and "unknown batch" in caught.value.reason
            assert seen == []
            assert "batch.nosuchbatch" not in rubris.engine.topics  # the server made none
            # the client let go too: the same name may be watched again
            with pytest.raises(SubscribeRejected):
                await watch_batch(client, "nosuchbatch", timeout=5)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_timeout_raises_and_unsubscribes(transport: str) -> None:
    rubris = batch_rubris()
    async with served(rubris) as url:
        async with Client(url, transport=transport) as client:  # type: ignore[arg-type]
            batch = await rubris.batches.open()
            await rubris.batches.add(batch, 3)
            seen: list[dict[str, Any]] = []
            with pytest.raises(asyncio.TimeoutError):
                await client.watch_batch(batch, on_update=seen.append, timeout=0.4)
            assert [s["state"] for s in seen] == ["open"]
            await until(lambda: not watched(rubris, batch))
            # a second watch of the same batch on the same client is allowed: nothing was kept
            with pytest.raises(asyncio.TimeoutError):
                await client.watch_batch(batch, timeout=0.2)
            await until(lambda: not watched(rubris, batch))


async def test_cancelling_a_watch_unsubscribes() -> None:
    rubris = batch_rubris()
    async with served(rubris) as url:
        async with Client(url) as client:
            batch = await rubris.batches.open()
            seen: list[dict[str, Any]] = []
            task = asyncio.create_task(client.watch_batch(batch, on_update=seen.append))
            await until(lambda: bool(seen) and watched(rubris, batch))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await until(lambda: not watched(rubris, batch))


async def test_failed_items_count_and_an_error_in_on_update_ends_the_watch() -> None:
    rubris = batch_rubris()
    async with served(rubris) as url:
        async with Client(url) as client:
            batch = await rubris.batches.open()
            ids = (await rubris.batches.add(batch, 4)).ids()
            await rubris.batches.seal(batch)
            await rubris.batches.ack(ids[:3])
            await rubris.batches.fail(ids[3:])
            # nobody watched when it completed: the state comes from the store, at once
            state = await client.watch_batch(batch, timeout=5)
            assert without_completed(state) == without_completed(final(4, 3, 1))

            def broken(state: dict[str, Any]) -> None:
                raise RuntimeError("the application's own error")

            with pytest.raises(RuntimeError, match="own error"):
                await client.watch_batch(batch, on_update=broken, timeout=5)
            await until(lambda: not watched(rubris, batch))


async def test_an_expired_batch_is_final_too() -> None:
    config = Config(
        timing=Timing(poll_timeout=1.0, session_timeout=5.0),
        batches=BatchConfig(expiry=0.2, sweep_every=3600),
    )
    rubris = Rubris(config, batches=MemoryBatchStore())
    async with served(rubris) as url:
        async with Client(url) as client:
            batch = await rubris.batches.open()
            await rubris.batches.add(batch, 2)
            seen: list[dict[str, Any]] = []
            watching = asyncio.create_task(client.watch_batch(batch, on_update=seen.append))
            await until(lambda: bool(seen))
            await asyncio.sleep(0.3)
            expired = await rubris.batches.sweep()
            assert [b for b, _ in expired] == [batch]
            result = await asyncio.wait_for(watching, 5)
            assert result == {
                "state": "expired",
                "total": 2,
                "done": 0,
                "failed": 0,
                "completed": False,
            }
            assert [s["state"] for s in seen] == ["open", "expired"]
            await until(lambda: not watched(rubris, batch))
