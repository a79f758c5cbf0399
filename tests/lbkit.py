"""``Balancer``: a TCP load balancer in the test's loop, in front of several nodes.

Clients get one address, as behind nginx. ``route(i)`` sends new connections to node ``i``;
``rotate=True`` sends each new connection to the next node in turn (no sticky routing);
``cut()`` drops every open connection (the plug pulled: both sides see the socket close), so
a client reconnects, through the balancer, to whichever node is routed to now.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from urllib.parse import urlsplit


class Balancer:
    def __init__(self, bases: list[str], *, rotate: bool = False) -> None:
        self.targets = [urlsplit(b) for b in bases]
        self.index = 0
        self.rotate = rotate
        self.connections: list[int] = [0] * len(bases)
        """Connections each node was given."""
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def base(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def route(self, index: int) -> None:
        self.index = index

    def cut(self) -> None:
        for w in list(self._open):
            with contextlib.suppress(OSError):
                w.transport.abort()
        self._open.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        target = self.targets[self.index]
        self.connections[self.index] += 1
        if self.rotate:
            self.index = (self.index + 1) % len(self.targets)
        try:
            up_r, up_w = await asyncio.open_connection(target.hostname, target.port)
        except OSError:
            writer.transport.abort()
            return
        self._open.update((writer, up_w))
        pumps = [
            asyncio.create_task(self._pump(reader, up_w)),
            asyncio.create_task(self._pump(up_r, writer)),
        ]
        self._tasks.update(pumps)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for p in pumps:
            p.cancel()
        for w in (writer, up_w):
            self._open.discard(w)
            w.transport.abort()
        self._tasks.difference_update(pumps)

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()

    async def __aenter__(self) -> Balancer:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cut()
        for t in list(self._tasks):
            t.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
