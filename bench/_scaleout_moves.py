"""Sessions moved to another node, for bench/scaleout.py: the ``carried`` configuration and the
``settle`` measurement.

A client *moved* drops its connection and reconnects to the other node with its resume token:
its session stays on the node it opened it on (the *home*) and the other node (the *entry*)
carries its frames through Redis (rubris_asgi/server/relay/). The reconnection is raw (TCP,
the HTTP upgrade, a HELLO with the token, no SUBSCRIBE: the session holds its subscriptions),
read from the first byte by :class:`MovedReader` (bench/_fanout_load.py's ``RawReader``), so a
frame that follows the WELCOME at once, as under load, is read like any other rather than
lost to a handshake library's buffer. The raw client does not restate its ring positions
(protocol.md section 5): messages written to the dropped connection are not sent again, which
changes nothing measured here (latency, not loss: the fault suite and bench/faults.py count
that).

``settle``: 1,000 clients of node A under a steady ring load (each of the 10 topics publishes
5 times a second, every client subscribes to all: 50,000 deliveries/s), all moved to node B at
once; the figure is the time from the move until every client has received a message no older
than 100 ms (each client's first such message: its rings are caught up, since a frame carries
every topic in turn and rings are read in order).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from _fanout_load import Client, RawReader, Recorder, masked

from rubris_asgi.protocol import Hello, encode_frame

FRESH_NS = 100_000_000
"""A message at most this old (publish to receive) says its client is caught up."""


class MovedReader(RawReader):
    """A moved client's socket from its first byte: the HTTP upgrade's answer, then frames;
    notes when it first read a message at most ``FRESH_NS`` old (``fresh_ns``)."""

    def __init__(self, rec: Recorder, decode: str, transport: Any) -> None:
        super().__init__(rec, decode, transport)
        self.upgraded = False
        self.head = b""
        self.fresh_ns = 0
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        if not self.upgraded:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            status = self.head.split(b" ", 2)[1]
            if status != b"101":
                if not self.opened.done():
                    self.opened.set_exception(RuntimeError(f"upgrade refused: {status!r}"))
                return
            self.upgraded = True
            data, self.head = self.head[end + 4 :], b""
            if not self.opened.done():
                self.opened.set_result(None)
            if not data:
                return
        rec = self.rec
        n0 = len(rec.lat)
        super().data_received(data)
        if not self.fresh_ns and len(rec.lat) > n0 and min(rec.lat[n0:]) <= FRESH_NS:
            self.fresh_ns = time.monotonic_ns()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(RuntimeError(f"connection lost: {exc}"))
        super().connection_lost(exc)


async def resume_client(port: int, old: Client, rec: Recorder, decode: str) -> Client:
    """``old``'s session resumed through the node at ``port`` (``old``'s socket left alone)."""
    loop = asyncio.get_running_loop()
    transport, reader = await loop.create_connection(
        lambda: MovedReader(rec, decode, None), "127.0.0.1", port
    )
    reader.transport = transport
    key = os.urandom(16).hex()[:22] + "=="
    transport.write(
        (
            "GET /rubris/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: rubris.v1\r\n\r\n"
        ).encode()
    )
    await asyncio.wait_for(reader.opened, 30)
    transport.write(masked(0x2, encode_frame([Hello(1, old.resume)]), reader.mask))
    client = Client(None, old.heartbeat_ms, old.topics)  # type: ignore[arg-type]
    client.reader = reader
    client.resume = old.resume
    return client


async def move(
    clients: list[Client], port: int, rec: Recorder, decode: str, concurrency: int = 200
) -> list[Client]:
    """Every client's connection dropped (closed abruptly, as a balancer's failover does) and
    its session resumed through the node at ``port``; the new clients, in order."""
    for c in clients:
        assert c.reader is not None
        c.reader.ended = True  # not counted as a close the server made
        c.reader.transport.abort()
    sem = asyncio.Semaphore(concurrency)

    async def one(c: Client) -> Client:
        async with sem:
            return await resume_client(port, c, rec, decode)

    return list(await asyncio.gather(*(one(c) for c in clients)))


def settled(clients: list[Client], since_ns: int) -> tuple[int, list[float]]:
    """How many of ``clients`` have read a fresh message since ``since_ns``, and their
    seconds from it."""
    times = [
        (c.reader.fresh_ns - since_ns) / 1e9
        for c in clients
        if isinstance(c.reader, MovedReader) and c.reader.fresh_ns > since_ns
    ]
    return len(times), times
