"""``Lanes``: a node's publishes on their way to a Redis Cluster, one lane per partition.

On one Redis the outbox is one queue sent batch by batch (outbox.py). On a cluster that would
make every topic wait for the slowest master: a batch holding one publish for a master that is
away waits until it is back, and every publish behind it with it. So each partition has a lane
of its own, sent by a task of its own (started at its first publish, ended once it is empty),
one batch at a time and retried under the same batch id until its master answers (the script
answers a repeat from its first run), with its own ``Reach``: a partition whose master is away
refuses new publishes, saying so, while the others take and send theirs.

Bounds: the lanes share the outbox's (``outbox_messages``, ``outbox_bytes``, the part kept for
the application), counted over all lanes, so a master away can hold at most what was accepted
for it before its lane found it away.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from ....errors import BrokerUnavailable
from ...base import BrokerStats
from ..outbox import BATCH, Entry, Outbox
from ..reach import Reach, end_if_cancelled

log = logging.getLogger("rubris_asgi.broker")

SendPart = Callable[[int, Sequence[Entry], str, Reach], Awaitable[list[int]]]
"""``send(partition, batch, batch_id, reach)``: the seqs of ``batch``, sent until answered."""


class Lane:
    """One partition's publishes waiting, in order, and whether its master answers."""

    __slots__ = ("entries", "reach", "task")

    def __init__(self, reach: Reach) -> None:
        self.entries: deque[Entry] = deque()
        self.reach = reach
        self.task: asyncio.Task[None] | None = None


class Lanes(Outbox):
    """An ``Outbox`` whose publishes wait in one lane per partition (``partition(name)``)."""

    def __init__(
        self,
        messages: int,
        nbytes: int,
        counters: BrokerStats,
        app_share: float,
        partition: Callable[[str], int],
    ) -> None:
        super().__init__(messages, nbytes, counters, app_share)
        self.partition = partition
        self.lanes: dict[int, Lane] = {}
        self.count = 0
        """Publishes waiting in every lane."""
        self._send: SendPart | None = None
        self._node = ""
        self._room_made: Callable[[], None] = lambda: None

    def __len__(self) -> int:
        return self.count

    def lane(self, partition: int) -> Lane:
        lane = self.lanes.get(partition)
        if lane is None:
            lane = self.lanes[partition] = Lane(
                Reach(self.counters, f"the Redis master of partition {partition}")
            )
        return lane

    def unavailable(self, partition: int) -> str | None:
        """Why ``partition``'s master takes nothing now, or None."""
        lane = self.lanes.get(partition)
        if lane is None or lane.reach.up:
            return None
        return lane.reach.reason or f"the Redis master of partition {partition} is unreachable"

    @property
    def up(self) -> bool:
        """Whether every partition's master answered its lane's latest call."""
        return all(lane.reach.up for lane in self.lanes.values())

    def start(self, send: SendPart, node: str, room_made: Callable[[], None]) -> None:
        """Send from now on with ``send``; ``room_made()`` when a batch sent made room for an
        intake that waits."""
        self._send = send
        self._node = node
        self._room_made = room_made

    def put(self, entry: Entry) -> None:
        p = self.partition(entry.topic.name)
        lane = self.lane(p)
        lane.entries.append(entry)
        self.size += entry.nbytes
        self.count += 1
        counters = self.counters
        counters.relayed += 1
        if self.count > counters.pending_peak:
            counters.pending_peak = self.count
        if lane.task is None and self._send is not None:
            lane.task = asyncio.get_running_loop().create_task(
                self._run(p, lane), name=f"rubris-broker-lane-{p}"
            )

    async def _run(self, p: int, lane: Lane) -> None:
        """Send lane ``p`` batch by batch until it is empty."""
        send = self._send
        assert send is not None
        entries = lane.entries
        try:
            while entries:
                end_if_cancelled()
                batch = list(itertools.islice(entries, BATCH))
                batch_id = f"{self._node}:{next(self._batches)}"
                seqs = await self.sent(batch, send(p, batch, batch_id, lane.reach))
                for _ in batch:
                    entries.popleft()
                self.count -= len(batch)
                self.numbered(batch, seqs, self._room_made)
        finally:
            lane.task = None
            if not self.count:
                self._emptied.set()

    async def flush(self, timeout: float) -> None:
        if self.count:
            self._emptied.clear()
            try:
                await asyncio.wait_for(self._emptied.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        if self.count:
            log.error("Redis broker stopped with %d publishes not sent", self.count)

    async def stop(self) -> None:
        """Cancel every lane's sender."""
        tasks = [lane.task for lane in self.lanes.values() if lane.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

    def fail_all(self, lost: BrokerUnavailable) -> None:
        for lane in self.lanes.values():
            while lane.entries:
                entry = lane.entries.popleft()
                if entry.done is not None and not entry.done.done():
                    entry.done.set_exception(lost)
        self.size = 0
        self.count = 0
