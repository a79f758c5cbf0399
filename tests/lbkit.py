"""``Balancer``: a TCP load balancer in the test's loop, in front of several nodes.

Clients get one address, as behind nginx. ``route(i)`` sends new connections to node ``i``;
``rotate=True`` sends each new connection to the next node in turn (no sticky routing);
``cut()`` drops every open connection (the plug pulled: both sides see the socket close), so
a client reconnects, through the balancer, to whichever node is routed to now.

Two faults for tests/test_faults.py, both on the connections open at the call only (new ones
are routed as usual):

``reset()`` ends them abortively, SO_LINGER 0 before the close, so the kernel sends a TCP RST
to both the client and the node instead of a FIN: what a crashed middlebox or a peer's reboot
does, each side learning at once and nothing in flight being delivered.

``blackhole()`` makes them a dead path: from then on the balancer reads what either side sends
and drops it, forwarding nothing in either direction, and closes nothing; one side's close is
not passed on either. Each side learns only by its own timeout (the client's heartbeat, the
node's silent-connection check), as when a NAT entry or a route disappears. A blackholed
connection ends when both sides have closed it, or at ``cut()``/``reset()``/exit.

``hold()`` stops forwarding on every connection, open or new, both ways, without reading or
dropping anything; ``release()`` lets it all through: a path that stalls (a switch buffering,
a VM migrating) and comes back. A side that gives up meanwhile has its close passed on after
the release, behind what it had sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
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
        self._dead: set[asyncio.StreamWriter] = set()  # blackholed: read and dropped
        self._handlers: set[asyncio.Task[object]] = set()  # one a connection, awaited at exit
        self._flowing = asyncio.Event()  # cleared by hold(): nothing read, nothing forwarded
        self._flowing.set()

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

    def reset(self) -> None:
        """Drop every open connection with a TCP RST to both sides (SO_LINGER 0)."""
        for w in list(self._open):
            with contextlib.suppress(OSError):
                sock = w.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.cut()

    def blackhole(self) -> int:
        """Stop forwarding on every open connection, both ways, closing nothing; returns how
        many connections (client side) it took."""
        before = len(self._dead)
        self._dead.update(self._open)
        return (len(self._dead) - before) // 2

    def hold(self) -> None:
        """Stop forwarding on every connection, both ways, reading nothing and closing nothing,
        until ``release()``."""
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        if me is not None:
            self._handlers.add(me)
            me.add_done_callback(self._handlers.discard)
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
        if writer in self._dead:
            # a dead path passes no close on: the other side learns by its own timeout
            await asyncio.wait(pumps)
        for p in pumps:
            p.cancel()
        for w in (writer, up_w):
            self._open.discard(w)
            self._dead.discard(w)
            w.transport.abort()
        self._tasks.difference_update(pumps)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                await self._flowing.wait()
                data = await src.read(65536)
                await self._flowing.wait()  # read as a hold began (data or the end): after it
                if not data:
                    break
                if dst in self._dead:
                    continue  # the path is dead: what was sent is lost on the way
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
        # every connection's handler has closed both its sockets before the loop goes on (a
        # socket left to the garbage collector is a ResourceWarning in some later test)
        if self._handlers:
            await asyncio.wait(set(self._handlers), timeout=5)
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
