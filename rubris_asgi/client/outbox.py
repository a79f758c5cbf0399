"""The bounded outbox: client messages waiting for the writer, in send order."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from ..protocol import ClientMessage
from .errors import ConnectionLost, _copy

OUTBOX_SIZE = 10_000
"""Client messages waiting to be sent before ``subscribe``/``call``/... wait for room."""


_Out = tuple[ClientMessage, bytes]


class _Outbox:
    """Client messages in send order, bounded; the writer takes them a frame at a time."""

    def __init__(self, maxsize: int = OUTBOX_SIZE) -> None:
        self.items: deque[_Out] = deque()
        self.maxsize = maxsize
        self.ready = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()
        self.idle = asyncio.Event()
        """Set while nothing waits here and the writer has nothing on its way (what ``close``
        waits for, so that what was handed over goes out before the connection is closed)."""
        self.idle.set()
        self.closed: ConnectionLost | None = None

    def __len__(self) -> int:
        return len(self.items)

    async def put(self, item: _Out) -> None:
        while len(self.items) >= self.maxsize and self.closed is None:
            self.room.clear()
            await self.room.wait()
        if self.closed is not None:
            raise _copy(self.closed)
        self.put_nowait(item)

    def put_nowait(self, item: _Out) -> None:
        """Control messages (ACK, PING, NAK) skip the bound: they are few by construction."""
        if self.closed is None:
            self.items.append(item)
            self.ready.set()
            self.idle.clear()

    def push_front(self, items: list[_Out]) -> None:
        self.items.extendleft(reversed(items))
        if self.items:
            self.ready.set()
            self.idle.clear()

    def discard(self, kinds: tuple[type[Any], ...]) -> None:
        self.discard_where(lambda msg: isinstance(msg, kinds))

    def discard_where(self, drop: Callable[[ClientMessage], bool]) -> None:
        self.items = deque(i for i in self.items if not drop(i[0]))
        self.room.set()

    async def take(self, limit: int) -> list[bytes]:
        """At least one message, then as many more as fit in ``limit`` bytes, in order."""
        while not self.items:
            # the writer is back here with nothing to take: what it took is written, and
            # nothing waits (also after discard() emptied the outbox)
            self.idle.set()
            self.ready.clear()
            await self.ready.wait()
        out: list[bytes] = []
        size = 0
        items = self.items
        while items:
            data = items[0][1]
            if out and size + len(data) > limit:
                break
            items.popleft()
            out.append(data)
            size += len(data)
        if len(items) < self.maxsize:
            self.room.set()
        return out

    def written(self) -> None:
        """The writer wrote what it took: idle if nothing came meanwhile."""
        if not self.items:
            self.idle.set()

    def fail(self, exc: ConnectionLost) -> None:
        self.closed = exc
        self.items.clear()
        self.room.set()
        self.idle.set()
