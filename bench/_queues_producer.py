"""The client producer of bench/queues.py: a ``rubris_asgi.client.Client`` that PUBLISHes items.

Items are ``{"i": <id>, "t": <CLOCK_MONOTONIC ns>}`` as the server's own producer makes them:
``i`` numbers them from 0 in the order they are offered, ``t`` is taken just before the item is
handed to the client (so the latency the load measures runs from the producer's call to the
consumer's ``ack()``, the loopback hop to the server included).

How an item is sent: ``Client.enqueue(name, value)`` (it returns when the server took the item,
raises ``ItemRefused`` when the server refused it and ``OutcomeUnknown`` when the connection was
lost before the outcome was known), at most ``window`` of them in flight at once; the flood
sends runs of ``RUN`` items with ``Client.enqueue_many`` (one wait a run, the refusals by
index). ``told`` counts the refusals the producer was told about, ``refused_ids`` the ids they
concern, ``unknown`` the outcomes never known.

Three ways to offer items:

- ``backlog(depth)``: the same standing backlog as the server's ``mode=backlog``: ask the
  server how many items wait (RPC ``waiting``: the queue and its lanes, answered after every
  PUBLISH this client sent before the CALL), send ``depth`` minus that many, wait until the
  server took them, 1 ms, again. (Keeping "taken minus completed" at ``depth`` instead would
  starve the consumers: with the round trip of the scenario they hold about 26 items each.)
- ``paced(rate)``: ``rate`` items/s on a fixed schedule (every 1 ms what is due); the schedule's
  worst lateness is kept in ``max_late_ms``.
- ``flood(cap, completed)``: as fast as the window allows, while items taken and not yet
  completed (``completed()``: the consumers' count) stay under ``cap``.

``ProducerThread`` runs a producer (and whatever else, e.g. delay lines) on an event loop of its
own in a thread of the load process, so that a stalled consumer loop does not stall it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import uvloop

from rubris_asgi.client import Client, ItemRefused, OutcomeUnknown

T = TypeVar("T")
RUN = 256
"""Items of one ``enqueue_many()`` call in the flood (throughput) mode."""


class ClientProducer:
    """One producer client and what it offered (see the module docstring)."""

    def __init__(self, url: str, queue: str, window: int = 256) -> None:
        self.client = Client(url)
        self.queue = queue
        self.window = window
        self.next_id = 0
        self.taken = 0  # items the server took
        self._told = 0  # ItemRefused
        self.unknown = 0  # OutcomeUnknown
        self._refused: set[int] = set()
        self.errors: list[str] = []
        self.max_late_ms = 0.0
        self.inflight = 0
        self.task: asyncio.Task[None] | None = None

    @property
    def api(self) -> str:
        return "enqueue"

    @property
    def told(self) -> int:
        """Refusals the producer was told about."""
        return self._told

    @property
    def refused_ids(self) -> set[int]:
        """Ids of refused items."""
        return self._refused

    async def connect(self) -> None:
        await self.client.connect()

    async def close(self) -> None:
        await self.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.close(), 5)

    def start(self, coro: Coroutine[Any, Any, None]) -> None:
        self.task = asyncio.get_running_loop().create_task(self._guard(coro))

    async def stop(self) -> None:
        task, self.task = self.task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        # what was sent before the stop: its outcome is still counted
        deadline = time.monotonic() + 5
        while self.inflight and time.monotonic() < deadline:  # noqa: ASYNC110 - a few polls
            await asyncio.sleep(0.01)

    async def _guard(self, coro: Awaitable[None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported by the bench
            self.errors.append(repr(exc))

    def _value(self) -> tuple[int, dict[str, int]]:
        i = self.next_id
        self.next_id = i + 1
        return i, {"i": i, "t": time.monotonic_ns()}

    async def _enqueue(self, i: int, value: dict[str, int]) -> None:
        self.inflight += 1
        try:
            await self.client.enqueue(self.queue, value)  # type: ignore[attr-defined]
            self.taken += 1
        except ItemRefused:
            self._told += 1
            self._refused.add(i)
        except OutcomeUnknown:
            self.unknown += 1
        finally:
            self.inflight -= 1

    async def _send(self, n: int, slots: asyncio.Semaphore | None) -> list[asyncio.Task[None]]:
        """Offer ``n`` items, one ``enqueue`` task each, at most ``window`` in flight."""
        assert slots is not None
        tasks = []
        for _ in range(n):
            await slots.acquire()
            i, value = self._value()
            t = asyncio.get_running_loop().create_task(self._enqueue(i, value))
            t.add_done_callback(lambda _t: slots.release())
            tasks.append(t)
        return tasks

    async def backlog(self, depth: int) -> None:
        slots = asyncio.Semaphore(self.window)
        call = self.client.call
        while True:
            waiting = await call("waiting")
            tasks = await self._send(max(0, depth - int(waiting)), slots)
            if tasks:
                # a stop cancels the pump, not the items in flight: their outcome is counted
                await asyncio.shield(asyncio.gather(*tasks))
            await asyncio.sleep(0.001)

    async def paced(self, rate: float) -> None:
        slots = asyncio.Semaphore(self.window)
        interval_ns = int(1e9 / rate)
        due = time.monotonic_ns()
        while True:
            now = time.monotonic_ns()
            n = 0
            while due <= now:
                self.max_late_ms = max(self.max_late_ms, (now - due) / 1e6)
                n += 1
                due += interval_ns
            if n:
                await self._send(n, slots)
            await asyncio.sleep(max(0.0, (due - time.monotonic_ns()) / 1e9))

    async def flood(self, cap: int, completed: Callable[[], int]) -> None:
        # runs of at most RUN items, one enqueue_many() each, at most ``window`` in flight:
        # one wait a run, not a task an item (what a producer that needs speed does)
        loop = asyncio.get_running_loop()
        runs: set[asyncio.Task[None]] = set()
        while True:
            room = min(
                cap - (self.taken + self.inflight - completed()), self.window - self.inflight
            )
            if room <= 0:
                await asyncio.sleep(0.0005)
                continue
            run = [self._value() for _ in range(min(room, RUN))]
            self.inflight += len(run)
            t = loop.create_task(self._enqueue_run(run))
            runs.add(t)
            t.add_done_callback(runs.discard)
            await asyncio.sleep(0)

    async def _enqueue_run(self, run: list[tuple[int, dict[str, int]]]) -> None:
        try:
            refused = await self.client.enqueue_many(self.queue, [v for _, v in run])
            self.taken += len(run) - len(refused)
            self._told += len(refused)
            for r in refused:
                self._refused.add(run[r.index][0])
        except OutcomeUnknown as exc:
            self.unknown += len(exc.value)
        finally:
            self.inflight -= len(run)

    def info(self) -> dict[str, Any]:
        return {
            "api": self.api,
            "next_id": self.next_id,
            "taken": self.taken,
            "told": self.told,
            "unknown": self.unknown,
            "max_late_ms": self.max_late_ms,
            "errors": self.errors,
        }


class ProducerThread:
    """An event loop (uvloop) in a thread of its own; ``run(coro)`` awaits a coroutine on it."""

    def __init__(self) -> None:
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self._main, name="queues-outside", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()
