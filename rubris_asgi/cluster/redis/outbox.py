"""``Outbox``: the shared publishes of one node on their way to Redis, bounded, sent in batches.

A publish relayed by the engine is put here at once (the engine does not wait); one task
sends what waits, up to ``BATCH`` publishes in one script call, retried under the same batch
id until Redis answers (the script answers a repeat from its first run: nothing is numbered
twice). Bounds: ``messages`` publishes and ``nbytes`` of payload; a publish over them is
refused with ``BrokerUnavailable`` saying which bound (``refuse``), never dropped.

What the intake took from outside publishers (the HTTP API, clients' PUBLISH) may fill the
outbox up to ``messages - reserve`` and ``nbytes - reserve_bytes`` only (``room_for_taken``):
the rest is the application's own, for its ``publish``, ``publish_async`` and batch
announcements, which an outside flood can then never starve. A message the intake cannot hand
over waits there (``Backlogged``, engine/intake.py); the intake is woken when a batch sent
makes room.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from ...engine.topics import SharedTopic
from ...errors import BrokerUnavailable
from ..base import BrokerStats
from .reach import end_if_cancelled

log = logging.getLogger("rubris_asgi.broker")

BATCH = 256
"""Publishes in one script call at most: one call blocks Redis for well under a millisecond."""


class Entry:
    """One publish in the outbox."""

    __slots__ = ("topic", "payload", "compressed", "cond", "done", "nbytes")

    def __init__(
        self,
        topic: SharedTopic,
        payload: bytes,
        compressed: bool,
        cond: int,
        done: asyncio.Future[int] | None,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.compressed = compressed
        self.cond = cond
        """The script's condition: 0 none, 1 a first value, 2 only if Redis knows the topic."""
        self.done = done
        self.nbytes = len(payload)
        """What it counts against the outbox's bytes (a keyed change: all it holds)."""


Send = Callable[[Sequence[Entry], str], Awaitable[list[int]]]
"""``send(batch, batch_id)``: number ``batch`` in Redis (retried until it answers); the seqs."""


class Outbox:
    """What waits to be numbered by Redis, and the task that sends it."""

    def __init__(self, messages: int, nbytes: int, counters: BrokerStats, app_share: float) -> None:
        self.messages = messages
        self.nbytes = nbytes
        self.taken_messages = messages - int(messages * app_share)
        """What the intake's messages may fill at most (the rest is the application's)."""
        self.taken_bytes = nbytes - int(nbytes * app_share)
        self.counters = counters
        self.intake_waiting = False
        """The intake found no room (``room_for_taken``): wake it when a batch makes some."""
        self.entries: deque[Entry] = deque()
        self.size = 0
        """Payload bytes waiting."""
        self._wake = asyncio.Event()
        self._emptied = asyncio.Event()
        self._batches = itertools.count(1)

    def __len__(self) -> int:
        return len(self.entries)

    def room(self, messages: int, nbytes: int) -> bool:
        """Whether ``messages`` publishes of ``nbytes`` fit, all of them."""
        return len(self) + messages <= self.messages and self.size + nbytes <= self.nbytes

    def room_for_taken(self, nbytes: int) -> bool:
        """Whether a message the intake took (``nbytes`` of payload) fits in the outside
        publishers' part; when not, the intake is marked waiting for room."""
        if len(self) < self.taken_messages and self.size + nbytes <= self.taken_bytes:
            return True
        self.intake_waiting = True
        return False

    def refuse(self, down: str | None, messages: int) -> None:
        """Raise ``BrokerUnavailable`` with the reason a publish is not taken: ``down``, why
        Redis takes nothing now (None: it does, and the outbox is full)."""
        self.counters.refused += 1
        if down is not None:
            raise BrokerUnavailable(f"{down}: publish refused, try again shortly")
        if len(self) + messages > self.messages:
            raise BrokerUnavailable(
                f"{len(self)} publishes wait to be sent to Redis, the most this node "
                f"keeps (outbox_messages={self.messages}): try again shortly"
            )
        raise BrokerUnavailable(
            f"{self.size} bytes of publishes wait to be sent to Redis, with this one "
            f"over what this node keeps (outbox_bytes={self.nbytes}): try again shortly"
        )

    def put(self, entry: Entry) -> None:
        entries = self.entries
        entries.append(entry)
        self.size += entry.nbytes
        counters = self.counters
        counters.relayed += 1
        if len(entries) > counters.pending_peak:
            counters.pending_peak = len(entries)
        self._wake.set()

    async def run(self, send: Send, node: str, room_made: Callable[[], None]) -> None:
        """Send what waits, batch by batch, for ever (cancelled at stop); ``room_made()``
        when a batch sent made room for an intake that waits."""
        outbox = self.entries
        while True:
            end_if_cancelled()  # a cancel redis-py swallowed in the last batch: stop now
            if not outbox:
                self._wake.clear()
                await self._wake.wait()
            batch = list(itertools.islice(outbox, BATCH))
            seqs = await self.sent(batch, send(batch, f"{node}:{next(self._batches)}"))
            for _ in batch:
                outbox.popleft()
            self.numbered(batch, seqs, room_made)
            if not outbox:
                self._emptied.set()

    async def sent(self, batch: list[Entry], sending: Awaitable[list[int]]) -> list[int]:
        """The seqs ``sending`` (``batch`` on its way) answers; all 0, and every waiter told,
        when Redis refused the script (a bug, never a reason for the sender to stop)."""
        try:
            return await sending
        except Exception as exc:
            end_if_cancelled()
            log.exception("Redis refused a batch of %d publishes; they are dropped", len(batch))
            for entry in batch:
                if entry.done is not None and not entry.done.done():
                    entry.done.set_exception(BrokerUnavailable(f"Redis refused it: {exc}"))
            return [0] * len(batch)

    def numbered(self, batch: list[Entry], seqs: list[int], room_made: Callable[[], None]) -> None:
        """``batch`` left the outbox with ``seqs``: its room freed, its waiters answered, and
        ``room_made()`` when that made room for an intake that waits."""
        for entry, seq in zip(batch, seqs, strict=True):
            self.size -= entry.nbytes
            if seq:
                self.counters.numbered += 1
            if entry.done is not None and not entry.done.done():
                entry.done.set_result(int(seq))
        if self.intake_waiting and self.room_for_taken(0):
            self.intake_waiting = False
            room_made()

    async def flush(self, timeout: float) -> None:
        """Wait at most ``timeout`` seconds for what waits to be sent."""
        if self.entries:
            self._emptied.clear()
            try:
                await asyncio.wait_for(self._emptied.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        if self.entries:
            log.error("Redis broker stopped with %d publishes not sent", len(self.entries))

    def fail_all(self, lost: BrokerUnavailable) -> None:
        """What was never sent: its waiters get ``lost``; the outbox is empty after."""
        while self.entries:
            entry = self.entries.popleft()
            if entry.done is not None and not entry.done.done():
                entry.done.set_exception(lost)
        self.size = 0
