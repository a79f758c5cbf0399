"""``Replicas``: writes that count as done only once replicas have them (``WAIT``).

Redis replicates asynchronously: a master that acknowledged a write and died before its replica
received it loses that write in a failover, and the promoted replica never knew of it. For work
items, their settling (ACKs) and batch acks that is a lost or repeated job, so a broker may ask
for ``wait_replicas``: each script that writes them is followed, on the same connection, by
``WAIT wait_replicas timeout``, and only a write that many replicas confirmed counts as done (the
node's outbox keeps it until then). When fewer confirm within the timeout (a replica away, or
lagging), the write stays pending: a cheap write on one connection and ``WAIT`` again, after a
pause, until they do. The replication stream is in order, so confirming a later write confirms
the earlier one. Redis itself may still be answering everything meanwhile: nothing is marked
away, and new items are refused only when the node's outbox for them is full.

The cost is a round trip to the replica per script call (one per batch of up to 256 items):
docs/benchmarks.md measures it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.asyncio import Redis

from .reach import RETRY

log = logging.getLogger("rubris_asgi.broker")


class Replicas:
    """How many replicas must confirm a write of items or batches before it counts (0: none,
    Redis's acknowledgement is enough), and within what timeout each ``WAIT`` gives up."""

    def __init__(self, count: int, timeout: float, mark: str) -> None:
        if count < 0 or timeout <= 0:
            raise ValueError("wait_replicas must be 0 or more and wait_timeout positive")
        self.count = count
        self.timeout_ms = max(1, int(timeout * 1000))
        self.mark = mark
        """A key written to confirm what came before it (``INCR``)."""
        self.unconfirmed = 0
        """Writes whose ``WAIT`` fell short, and were confirmed again later."""
        self._warned = False

    async def run(self, redis: Redis, script: Any, *, keys: Any = None, args: Any = None) -> Any:
        """``script(keys, args)``'s answer, once ``count`` replicas have the write."""
        if not self.count:
            return await script(keys=keys, args=args)
        pipe = redis.pipeline(transaction=False)
        await script(keys=keys, args=args, client=pipe)
        pipe.execute_command("WAIT", self.count, self.timeout_ms)
        answer, confirmed = await pipe.execute()
        delay = RETRY[0]
        while int(confirmed) < self.count:
            self.unconfirmed += 1
            if not self._warned:
                self._warned = True
                log.warning(
                    "%d of wait_replicas=%d replicas confirmed a write within %d ms: "
                    "it counts once they do",
                    int(confirmed),
                    self.count,
                    self.timeout_ms,
                )
            await asyncio.sleep(delay)
            delay = min(2 * delay, RETRY[1])
            pipe = redis.pipeline(transaction=False)
            pipe.incr(self.mark)
            pipe.execute_command("WAIT", self.count, self.timeout_ms)
            _, confirmed = await pipe.execute()
        if self._warned:
            self._warned = False
            log.warning("the replicas confirm writes again (wait_replicas=%d)", self.count)
        return answer
