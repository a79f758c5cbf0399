"""``Tells``: one-way messages between nodes through Redis pub/sub, in order and together.

A request (``RedisNodeLink.ask``) is two PUBLISHes and a task on the other node, and waits a
round trip: right for the rare things (open a session there, send a private message), far too
much for every frame of a WebSocket carried for another node (server/relay/). What a relay
needs is a stream: each side appends records and the other reads them in order. This is it.

**Together.** What is told during one turn of the event loop (a cycle's frames for a thousand
carried sessions, the ACKs of every frame a bundle brought) waits in one buffer per (node, op)
and goes out as one PUBLISH per buffer, all the turn's PUBLISHes in one pipeline on one
connection: a message costs a few list appends here and one record on the other node, not a
command.

**In order.** One flush at a time, each on one connection, and the next starts only when
Redis has answered the last: Redis runs one connection's commands in order and writes each
PUBLISH to the subscribers' connections as it runs it, so what a node told another arrives in
the order told. A buffer larger than ``CHUNK`` is cut at the record boundaries its teller
marked (each ``tell`` call is whole) into several PUBLISHes of the same pipeline.

**At most once, and said when not sure.** A flush that Redis failed (a connection lost, a
refusal, no connection to be had) or whose PUBLISH reached nobody (the node is gone) is
reported to the op's ``untold(node, gone)`` for every node it carried messages to, and the
messages are dropped, never sent twice: the stream to that node is broken and the relays on
both ends start over (the clients resume). The memory this holds is what the tellers put in
one turn: the relays bound it (a window of frames per carried session, server/relay/).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import orjson
from redis.asyncio import Redis

from ..nodes import Untold

log = logging.getLogger("rubris_asgi.broker")

CHUNK = 512 * 1024
"""Bytes a PUBLISH carries at most (more goes in the next PUBLISH of the same pipeline): a
subscriber's connection buffers whole messages, and Redis disconnects one whose output buffer
passes ``client-output-buffer-limit pubsub`` (32 MB by default)."""


class Tells:
    """One node's outgoing one-way messages: buffered per (node, op), flushed in order."""

    def __init__(
        self,
        node: str,
        channel_of: Callable[[str], str],
        client: Callable[[], Redis],
        unavailable: Callable[[], str | None],
    ) -> None:
        """``channel_of(node)``: the channel a node listens on; ``client()``: the broker's
        Redis client, whose pool this shares; ``unavailable()``: why the broker takes nothing
        now (Redis away, or refusing writes), or None."""
        self.channel_of = channel_of
        self.node = node
        self._client = client
        self._unavailable = unavailable
        self._untold: dict[str, Untold] = {}
        self._waiting: dict[tuple[str, str], list[bytes]] = {}
        self._flushing: asyncio.Task[None] | None = None
        self.flushes = 0
        """Flushes done (each one pipeline): the operations page's view of how much goes
        together."""
        self.failed = 0
        """Flushes Redis failed."""

    def on(self, op: str, untold: Untold) -> None:
        self._untold[op] = untold

    def tell(self, node: str, op: str, body: bytes) -> None:
        key = (node, op)
        waiting = self._waiting.get(key)
        if waiting is None:
            self._waiting[key] = [body]
        else:
            waiting.append(body)
        if self._flushing is None:
            self._flushing = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, {}
                await self._send(batch)
        finally:
            self._flushing = None

    async def _send(self, batch: dict[tuple[str, str], list[bytes]]) -> None:
        """One pipeline of PUBLISHes for ``batch``; what did not surely arrive is reported."""
        commands: list[tuple[Any, ...]] = []
        owners: list[tuple[str, str]] = []
        for (node, op), bodies in batch.items():
            head = orjson.dumps({"op": op, "from": self.node, "t": 1}) + b"\n"
            channel = self.channel_of(node)
            for chunk in _chunks(bodies):
                commands.append((self.PUBLISH, channel, head + chunk))
                owners.append((node, op))
        down = self._unavailable()
        try:
            if down is not None:  # known away: not a wait for a connection that ends in error
                raise ConnectionError(down)
            receivers = await self._publish(commands, [node for node, _ in owners])
        except asyncio.CancelledError:
            self._lost(batch, gone=False)
            raise
        except Exception as exc:  # Redis failed: some may have gone, some not
            self.failed += 1
            log.warning("telling %d node(s) failed: %s", len({n for n, _ in batch}), exc)
            self._lost(batch, gone=False)
            return
        self.flushes += 1
        gone = {owner for owner, n in zip(owners, receivers, strict=True) if n == 0}
        for node, op in gone:
            self._report(node, op, gone=True)

    PUBLISH = "PUBLISH"
    """The command a message goes out with (a Redis Cluster's subclass: ``SPUBLISH``)."""

    async def _publish(self, commands: list[tuple[Any, ...]], nodes: list[str]) -> list[int]:
        """Send ``commands`` (each to the channel of the node at its place in ``nodes``) in one
        pipeline; the receivers of each."""
        pool: Any = self._client().connection_pool  # a pool.Pool: get_connection untyped
        conn = await pool.get_connection()
        try:
            await conn.send_packed_command(conn.pack_commands(commands))
            return [int(await conn.read_response()) for _ in commands]
        except BaseException:
            # replies may be left unread on it (an error reply raises at once): not reusable
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)

    def _lost(self, batch: dict[tuple[str, str], list[bytes]], gone: bool) -> None:
        for node, op in batch:
            self._report(node, op, gone)

    def _report(self, node: str, op: str, gone: bool) -> None:
        untold = self._untold.get(op)
        if untold is None:
            return
        try:
            untold(node, gone)
        except Exception:  # one relay's bug must not stop the others hearing of it
            log.exception("untold(%s, %s) failed", node, gone)

    def close(self) -> None:
        if self._flushing is not None:
            self._flushing.cancel()
        self._waiting.clear()


def _chunks(bodies: list[bytes]) -> list[bytes]:
    """``bodies`` joined into messages of at most ``CHUNK`` bytes (a body larger than that
    alone), never cutting one."""
    out: list[bytes] = []
    part: list[bytes] = []
    size = 0
    for b in bodies:
        if part and size + len(b) > CHUNK:
            out.append(b"".join(part))
            part, size = [], 0
        part.append(b)
        size += len(b)
    if part:
        out.append(b"".join(part))
    return out
