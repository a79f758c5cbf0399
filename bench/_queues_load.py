"""The load half of bench/queues.py: a delay line, consumers that work, and what they did.

``DelayLine`` (from tests/delaykit.py, which the tests share): a TCP relay on 127.0.0.1
between one client and the server that holds every chunk ``delay`` seconds in each direction
before passing it on (in order; no bandwidth limit). It is how the seed's 50 ms one-way
network is simulated: items reach the client 50 ms after the server framed them and every ACK
reaches the server 50 ms after the client sent it, and so do REVOKE, PING and PONG. The
client's own code runs unchanged: ``QueueItem.received`` is the time the item really arrived,
so its CoDel measures only the wait in its buffer.

``Worker``: one consumer's application: ``async for item in consumer``, then ``work`` seconds
of processing (``asyncio.sleep``: the four workers share one core, so a busy-wait would
serialise them), then ``item.ack()``. ``work`` may change during a run (the slowdown). It
records each processing interval (busy time) and each completion in a ``Ledger``.

``Ledger``: per item id, how many times it was processed, its enqueue stamp and the time of
its last completion (``time.monotonic_ns()``; the server's stamp is on the same clock).
``Counter``: the cheap version for the throughput run (acks, and completions per id).
"""

from __future__ import annotations

import asyncio
import time
from array import array

from rubris_asgi.client import Consumer
from tests.delaykit import DelayLine  # noqa: F401 (bench/queues.py imports it from here)


class Ledger:
    """Every completion of every item: processed how often, enqueued when, last done when."""

    def __init__(self) -> None:
        self.count: dict[int, int] = {}
        self.enqueued: dict[int, int] = {}
        self.done: dict[int, int] = {}
        self.by: dict[int, int] = {}  # the worker of the last completion
        self.attempt: dict[int, int] = {}  # the delivery attempt of the last completion

    def record(
        self, item_id: int, enqueued_ns: int, done_ns: int, worker: int, attempt: int
    ) -> None:
        self.count[item_id] = self.count.get(item_id, 0) + 1
        self.enqueued[item_id] = enqueued_ns
        self.done[item_id] = done_ns
        self.by[item_id] = worker
        self.attempt[item_id] = attempt

    @property
    def duplicates(self) -> int:
        """Completions beyond the first, over all items."""
        return sum(self.count.values()) - len(self.count)

    @property
    def items_twice(self) -> int:
        """Items processed more than once."""
        return sum(1 for n in self.count.values() if n > 1)


class Worker:
    """One consumer's application (see the module docstring)."""

    def __init__(self, index: int, work: float, ledger: Ledger) -> None:
        self.index = index
        self.work = work
        self.ledger = ledger
        self.busy = array("d")  # start, end, start, end, ... (time.monotonic())
        self.items = 0

    async def run(self, consumer: Consumer) -> None:
        sleep = asyncio.sleep
        clock = time.monotonic
        record = self.ledger.record
        busy = self.busy
        async for item in consumer:
            value = item.value
            t0 = clock()
            await sleep(self.work)
            done_ns = time.monotonic_ns()
            item.ack()
            busy.append(t0)
            busy.append(done_ns / 1e9)
            self.items += 1
            record(value["i"], value["t"], done_ns, self.index, item.attempt)

    def busy_within(self, a: float, b: float) -> float:
        """Seconds of processing inside [a, b]."""
        busy = self.busy
        total = 0.0
        for k in range(0, len(busy), 2):
            s, e = busy[k], busy[k + 1]
            if e > a and s < b:
                total += min(e, b) - max(s, a)
        return total

    def mean_work_within(self, a: float, b: float) -> float:
        """Mean measured processing time (s) of the items started inside [a, b]."""
        busy = self.busy
        spans = [busy[k + 1] - busy[k] for k in range(0, len(busy), 2) if a <= busy[k] < b]
        return sum(spans) / len(spans) if spans else float("nan")


class Counter:
    """The throughput run's consumers: ACK at once, count completions per id."""

    def __init__(self) -> None:
        self.counts = bytearray(1 << 20)
        self.acked = 0

    def seen(self, item_id: int) -> None:
        counts = self.counts
        if item_id >= len(counts):
            counts.extend(bytes(max(item_id + 1 - len(counts), len(counts))))
        if counts[item_id] < 255:
            counts[item_id] += 1

    async def run(self, consumer: Consumer) -> None:
        seen = self.seen
        async for item in consumer:
            item.ack()
            self.acked += 1
            seen(item.value["i"])

    def duplicates(self) -> int:
        c = self.counts
        return sum(c) - (len(c) - c.count(0))
