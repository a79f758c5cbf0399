"""``DelayLine``: a TCP relay on 127.0.0.1 that holds every chunk ``delay`` seconds each way.

How a test (and bench/queues.py) puts a client 50 ms from the server without a network: items
reach the client ``delay`` after the server framed them and every ACK reaches the server
``delay`` after the client sent it, and so do REVOKE, PING and PONG. The client's code runs
unchanged; chunks keep their order, there is no bandwidth limit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class _Pipe:
    """One direction of a ``DelayLine``: chunks leave ``delay`` after they came, in order."""

    def __init__(self, writer: asyncio.StreamWriter, delay: float) -> None:
        self.writer = writer
        self.delay = delay
        self.held: deque[tuple[float, bytes | None]] = deque()
        self.timer: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()

    def push(self, chunk: bytes | None) -> None:
        """Hold ``chunk`` (None: the end of the stream) for ``delay``."""
        due = self.loop.time() + self.delay
        self.held.append((due, chunk))
        if self.timer is None:
            self.timer = self.loop.call_at(due, self._release)

    def _release(self) -> None:
        self.timer = None
        held = self.held
        now = self.loop.time()
        while held and held[0][0] <= now:
            _, chunk = held.popleft()
            if chunk is None:
                self.writer.close()
                held.clear()
                return
            if not self.writer.is_closing():
                self.writer.write(chunk)
        if held:
            self.timer = self.loop.call_at(held[0][0], self._release)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.held.clear()
        self.writer.close()


class DelayLine:
    """A relay from a port of its own to ``127.0.0.1:target`` with ``delay`` each way."""

    def __init__(self, target: int, delay: float) -> None:
        self.target = target
        self.delay = delay
        self.server: asyncio.Server | None = None
        self.pipes: list[_Pipe] = []
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        to_server, to_client = _Pipe(up_writer, self.delay), _Pipe(writer, self.delay)
        self.pipes += [to_server, to_client]
        await asyncio.gather(self._pump(reader, to_server), self._pump(up_reader, to_client))

    async def _pump(self, reader: asyncio.StreamReader, pipe: _Pipe) -> None:
        try:
            while chunk := await reader.read(65536):
                pipe.push(chunk)
        except (ConnectionError, OSError):
            pass
        pipe.push(None)

    async def close(self) -> None:
        for p in self.pipes:
            p.close()
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2)
