"""``Link``: the subscriber connection to one master, for the sharded channels it serves.

Three tasks share the connection while it lives: the *reader* takes every reply and message
in the order Redis sent them, the *writer* sends ``SSUBSCRIBE``/``SUNSUBSCRIBE``/``PING`` in
the order they were asked for, and the *watchdog* sends ``PING`` every ``ping_every`` seconds
and fails the connection when no ``pong`` comes within ``ping_timeout`` (a connection that
hears nothing looks the same whether its master is idle, stalled or gone: only an answer
tells). The first of them to fail ends the other two; the link then tells its owner
(pubsub.py), waits a little, and connects again, subscribing to every channel it serves.

Replies to commands come in the order the commands were written; the only thing Redis sends
unasked is a message (``smessage``) and, when a slot moves away from this master, an
``sunsubscribe`` for each of the slot's channels (Redis 7). So the writer notes what it
sends (``_expect``), and each reply takes the oldest note: an error reply, which names no
channel, is then known to answer that ``SSUBSCRIBE``; an ``sunsubscribe`` that answers no
``SUNSUBSCRIBE`` is Redis's own.

The connection is made with no socket timeout (it waits for messages for ever; the watchdog
bounds every wait) and speaks RESP2, where messages and replies are plain arrays in both
redis-py 5 and 8 (redis-py 5's asyncio has no sharded pub/sub to build on).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any, Protocol

from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..reach import end_if_cancelled
from .address import Address
from .client import ShardedClient

log = logging.getLogger("rubris_asgi.broker")

SSUBSCRIBE = b"ssubscribe"
SUNSUBSCRIBE = b"sunsubscribe"
PING = b"ping"

BACKOFF = (0.1, 1.0)
"""Seconds between attempts to connect again: first, most (doubling)."""


class Owner(Protocol):
    """What a link tells its owner (``ShardedSubscriber``, pubsub.py), and reads of it."""

    client: ShardedClient
    ping_every: float
    ping_timeout: float

    def message(self, channel: bytes, data: bytes) -> None: ...

    def confirmed(self, link: Link, channel: bytes) -> bool: ...

    def report_lost(self, channels: list[bytes]) -> None: ...

    def link_failed(self, link: Link) -> None: ...

    def rerouted(self, link: Link) -> bool: ...

    def dropped(self, link: Link, channel: bytes) -> None: ...

    def refused(self, link: Link, channel: bytes, exc: ResponseError) -> None: ...


class Link:
    """The subscriber connection to the master at ``address``, and the channels it serves."""

    def __init__(self, owner: Owner, address: Address) -> None:
        self.owner = owner
        self.address = address
        self.channels: set[bytes] = set()
        """The followed channels this master serves, by the map: subscribed, or to be."""
        self.confirmed: set[bytes] = set()
        """Those Redis confirmed on the current connection: heard."""
        self.ready = False
        """Connected, and every channel of ``channels`` subscribed to or queued."""
        self.failing = False
        """The last connection failed and no new one is up yet."""
        self._outbox: deque[tuple[bytes, bytes]] = deque()
        """Commands for the writer: at most one per ``add``/``remove`` since the writer's last
        turn, and one PING; sent all at once each turn."""
        self._expect: deque[tuple[bytes, bytes]] = deque()
        """What was written and not answered yet, oldest first: at most the channels of this
        link and one PING, as each command is written once."""
        self._subscribing = 0
        """``SSUBSCRIBE`` in ``_expect``: the lost channels confirmed meanwhile are reported
        together when it falls to 0."""
        self._lost: list[bytes] = []
        self._wake = asyncio.Event()
        self._pong = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"rubris-shards-link-{address[0]}:{address[1]}"
        )

    # what the owner asks

    def add(self, channel: bytes) -> None:
        """Serve ``channel`` from now on: subscribed now if connected, else at the connect."""
        self.channels.add(channel)
        if self.ready:
            self._queue(SSUBSCRIBE, channel)

    def remove(self, channel: bytes) -> None:
        """Serve ``channel`` no more (unsubscribed if connected)."""
        self.channels.discard(channel)
        self.confirmed.discard(channel)
        if self.ready:
            self._queue(SUNSUBSCRIBE, channel)

    async def close(self) -> None:
        """Stop the link's tasks and close its connection."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task

    @property
    def done(self) -> bool:
        return self._task.done()

    # the connection's life

    async def _run(self) -> None:
        delay = BACKOFF[0]
        owner = self.owner
        while True:
            conn = owner.client.connection(self.address, None)
            tasks: list[asyncio.Task[None]] = []
            try:
                # bounded: the connection has no socket timeout, and a stalled master accepts
                # the TCP connect (its backlog) and then answers nothing redis-py sends
                await asyncio.wait_for(
                    conn.connect(),  # type: ignore[no-untyped-call]  # untyped in redis-py
                    owner.client.connect_timeout + owner.ping_timeout,
                )
                for channel in sorted(self.channels):
                    self._queue(SSUBSCRIBE, channel)
                self.ready = True
                self._wake.set()
                tasks = [
                    asyncio.create_task(self._read(conn), name="rubris-shards-reader"),
                    asyncio.create_task(self._write(conn), name="rubris-shards-writer"),
                    asyncio.create_task(self._watch(), name="rubris-shards-watchdog"),
                ]
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # raises what ended it
                raise RuntimeError("a subscriber task ended")  # they loop for ever
            except Exception as exc:
                end_if_cancelled()
                if not self.failing:
                    log.warning(
                        "the subscriber connection to %s:%d failed (%s); reconnecting",
                        *self.address,
                        exc or type(exc).__name__,
                    )
            finally:
                for task in tasks:
                    task.cancel()
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                self._reset()
                with contextlib.suppress(Exception):
                    await conn.disconnect()
            if not self.failing:  # it had been up: the pauses start afresh
                delay = BACKOFF[0]
            self.failing = True
            owner.client.suspect(self.address)
            owner.link_failed(self)
            await owner.client.refresh()  # bounded: refresh_timeout
            if not owner.rerouted(self):
                return  # no longer a master, and nothing to serve
            await asyncio.sleep(delay)
            delay = min(2 * delay, BACKOFF[1])

    def _reset(self) -> None:
        self.ready = False
        self.confirmed.clear()
        self._outbox.clear()
        self._expect.clear()
        self._subscribing = 0
        self._lost = []  # not reported: still interrupted, reported once heard again

    def _queue(self, kind: bytes, channel: bytes) -> None:
        self._outbox.append((kind, channel))
        self._wake.set()

    async def _write(self, conn: Any) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch = list(self._outbox)
            self._outbox.clear()
            if not batch:
                continue
            for kind, channel in batch:
                self._expect.append((kind, channel))
                if kind == SSUBSCRIBE:
                    self._subscribing += 1
            commands = [
                (kind.decode().upper(), channel) if channel else ("PING",)
                for kind, channel in batch
            ]
            await conn.send_packed_command(conn.pack_commands(commands), check_health=False)

    async def _watch(self) -> None:
        owner = self.owner
        while True:
            await asyncio.sleep(owner.ping_every)
            self._pong.clear()
            self._queue(PING, b"")
            try:
                await asyncio.wait_for(self._pong.wait(), owner.ping_timeout)
            except asyncio.TimeoutError:
                # one of DOWN (a bare TimeoutError is no longer, being asyncio's own)
                raise RedisTimeoutError(
                    f"no answer to PING within {owner.ping_timeout:g} s"
                ) from None
            if self.failing:  # answered: up again for good, as far as anyone can tell
                self.failing = False

    async def _read(self, conn: Any) -> None:
        while True:
            try:
                reply = await conn.read_response()
            except ResponseError as exc:  # an error reply: the connection stays good
                self._error(exc)
                continue
            self._reply(reply)

    # what Redis says

    def _reply(self, reply: Any) -> None:
        if isinstance(reply, list) and reply:
            kind = reply[0]
            if kind == b"smessage":
                self.owner.message(reply[1], reply[2])
            elif kind == SSUBSCRIBE:
                self._confirmed(reply[1])
                self._answered(SSUBSCRIBE)
            elif kind == SUNSUBSCRIBE:
                channel = reply[1]
                if self._expect and self._expect[0] == (SUNSUBSCRIBE, channel):
                    self._expect.popleft()
                else:  # Redis's own: the channel's slot left this master
                    self.confirmed.discard(channel)
                    if channel in self.channels:
                        self.channels.discard(channel)
                        self.owner.dropped(self, channel)
            elif kind == b"pong":
                self._answered(PING)
                self._pong.set()
        elif reply == b"PONG":  # a PING before any subscription
            self._answered(PING)
            self._pong.set()

    def _error(self, exc: ResponseError) -> None:
        """An error reply: it answers the oldest command written."""
        if not self._expect:
            log.warning("an error from %s:%d that answers nothing: %s", *self.address, exc)
            return
        kind, channel = self._expect[0]
        self._answered(kind)
        if kind == SSUBSCRIBE and channel in self.channels:
            self.channels.discard(channel)
            self.owner.refused(self, channel, exc)
        elif kind == PING:
            self._pong.set()  # an answer all the same (LOADING, say): the master is there

    def _answered(self, kind: bytes) -> None:
        """The oldest command written, of ``kind``, is answered."""
        if self._expect and self._expect[0][0] == kind:
            self._expect.popleft()
            if kind == SSUBSCRIBE:
                self._subscribing -= 1
        if not self._subscribing and self._lost:
            # the channels lost and heard again since the last report, together
            lost, self._lost = self._lost, []
            self.owner.report_lost(lost)

    def _confirmed(self, channel: bytes) -> None:
        if channel not in self.channels:
            return  # unfollowed or moved meanwhile (its SUNSUBSCRIBE is on its way)
        self.confirmed.add(channel)
        self.failing = False
        if self.owner.confirmed(self, channel):
            self._lost.append(channel)  # reported once the SSUBSCRIBEs written are answered
