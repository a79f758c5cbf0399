"""``RedisNodeLink``: requests from one node to another through Redis pub/sub; and what every
user of
Redis here shares: ``DOWN``, what a lost Redis raises, and ``REFUSING``, what one that takes no
writes for now raises (``Reach.until_answered`` retries a call on either).

Every node listens on its own channel, ``P n:NODE``. A request names an operation that the
receiving node registered (``on``), carries a small JSON head and a body of bytes, and gets
one reply on the asking node's channel. This is how a long-poll request that reaches a node
other than its session's is answered by the session's node (server/longpoll.py). A reply
lost or late raises ``NoReply`` (a ``TimeoutError``), which says nothing about Redis being
down, nor that the request was not acted on.

A message is ``head \\n body``: ``head`` is JSON without a newline (orjson writes none),
``{"op": ..., "rid": n, "from": NODE, ...}`` for a request, ``{"re": n, ...}`` for its reply
(``"error"`` when the handler failed). A request to a node nobody listens for (it died, or
never was) raises ``NodeGone`` at once: Redis says how many received it. A one-way message
(``tell``, tells.py) has the head ``{"op": ..., "from": NODE, "t": 1}`` and is handed to its
``told`` in the reader's own callback, so in the order it came.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.exceptions import (
    ClusterDownError,
    MasterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...errors import BrokerUnavailable
from ..nodes import Abandoned, Handler, Head, MaybeSent, NodeGone, NodeLink, NoReply, Told, Untold
from .tells import Tells

log = logging.getLogger("rubris_asgi.broker")

DOWN = (RedisConnectionError, RedisTimeoutError, ConnectionError)
"""What a lost or unreachable Redis raises (redis-py's own, and a socket's error it lets
through). Not ``OSError`` as a whole: since Python 3.11 ``asyncio.TimeoutError`` is the
builtin ``TimeoutError``, an ``OSError``, and a wait of ours that timed out (a reply from
another node) is no sign that Redis is away."""
REFUSING = (OutOfMemoryError, ReadOnlyError, MasterDownError, TryAgainError, ClusterDownError)
"""What a Redis that answers but takes no writes for now raises: out of memory under
``maxmemory-policy noeviction``, a replica (the master failed over), a replica cut off from its
master, a busy key, a Redis Cluster that serves no master for the slot (``CLUSTERDOWN``,
redis-py 8's ``ClusterDownError``). Nothing was written (Redis refuses a script at its first
write, so none ran half-way): retried as for ``DOWN``, and reported as what it is."""
LIVE = 30.0
"""Seconds since its last heartbeat within which a node counts as live (``live``): past any
``node_timeout`` a deployment sets, so a node paused for a while is still asked."""
REPLY_TRIES = 3
"""How many times a reply is published on a connection that dies under it (a reply sent twice
is harmless, a reply lost leaves the asking node waiting for its timeout)."""
RETRIED = (*DOWN, *REFUSING)
"""What a call to Redis is tried again on, after a pause (``Reach.until_answered``)."""


class RedisNodeLink(NodeLink):
    """One node's end: it asks other nodes, and answers what they ask it, through Redis."""

    def __init__(
        self,
        prefix: str,
        node: str,
        client: Callable[[], Redis],
        unavailable: Callable[[], str | None],
    ) -> None:
        """``client()``: the broker's Redis client (once started), whose pool this shares;
        ``unavailable()``: why the broker takes nothing now (Redis away, or refusing writes),
        or None."""
        super().__init__(node)
        self.prefix = prefix
        self.channel = self.channel_of(node).encode()
        self._client = client
        self._unavailable = unavailable
        self._handlers: dict[str, Handler] = {}
        self._asks: dict[int, asyncio.Future[tuple[Head, bytes]]] = {}
        self._rids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._told: dict[str, Told] = {}
        self.tells = Tells(node, self.channel_of, client, unavailable)

    def on(self, op: str, handler: Handler) -> None:
        """Answer requests ``op`` with ``handler(head, body) -> (head, body)``."""
        self._handlers[op] = handler

    def on_tell(self, op: str, told: Told, untold: Untold) -> None:
        self._told[op] = told
        self.tells.on(op, untold)

    def tell(self, node: str, op: str, body: bytes) -> None:
        """One way, in order, together with the turn's others (tells.py)."""
        self.tells.tell(node, op, body)

    async def ask(
        self, node: str, op: str, head: Head, body: bytes, timeout: float
    ) -> tuple[Head, bytes]:
        """Ask ``node`` and wait for its reply. Raises ``NodeGone`` (nobody received it), what
        the publish raises (``NodeLink.ask`` says what each means), ``NoReply`` (sent, no reply
        within ``timeout``), ``Abandoned`` (this node stopped meanwhile), or ``RuntimeError``
        with the other node's error."""
        try:
            return await self._ask(node, op, head, body, timeout)
        except DOWN as exc:  # not from the publish, which says how far it went: it may have
            raise MaybeSent(f"Redis failed while asking node {node}: {exc}") from exc

    async def _ask(
        self, node: str, op: str, head: Head, body: bytes, timeout: float
    ) -> tuple[Head, bytes]:
        rid = next(self._rids)
        fut: asyncio.Future[tuple[Head, bytes]] = asyncio.get_running_loop().create_future()
        self._asks[rid] = fut
        try:
            msg = orjson.dumps({**head, "op": op, "rid": rid, "from": self.node}) + b"\n" + body
            if not await self._publish(node, msg):
                raise NodeGone(f"node {node} is not listening")
            try:
                reply, data = await asyncio.wait_for(fut, timeout)
            except asyncio.TimeoutError:
                raise NoReply(f"no reply from node {node} to {op} in {timeout:g} s") from None
        finally:
            self._asks.pop(rid, None)
        if "error" in reply:
            raise RuntimeError(f"node {node} failed {op}: {reply['error']}")
        return reply, data

    def channel_of(self, node: str) -> str:
        """The channel ``node`` listens on (``P n:NODE``)."""
        return self.prefix + "n:" + node

    async def _publish(self, node: str, message: bytes) -> int:
        """PUBLISH a message to ``node`` (a request or a reply); how many received it.

        On a connection taken here rather than by ``Redis.publish``, so that a failure says how
        far the message went (``Rubris.send_to`` must not call a message that was passed on
        undelivered): ``BrokerUnavailable`` when nothing was written (no connection to be had,
        the connection or its health check failed, Redis refused the command), ``MaybeSent``
        once the command may have been written (Redis may have passed it on)."""
        down = self._unavailable()
        if down is not None:  # refused at once, as a publish is: not after a wait for a
            raise BrokerUnavailable(down)  # connection that would end as PoolBusy
        pool: Any = self._client().connection_pool  # a pool.Pool: get_connection untyped
        try:
            conn = await pool.get_connection()  # PoolBusy (nothing sent) when none comes free
        except DOWN as exc:
            raise BrokerUnavailable(f"Redis is unreachable: {exc}") from exc
        try:
            try:
                await conn.check_health()
            except DOWN as exc:
                raise BrokerUnavailable(f"Redis is unreachable: {exc}") from exc
            try:  # redis-py disconnects the connection itself when this fails or is cancelled
                await conn.send_packed_command(
                    conn.pack_command("PUBLISH", self.channel_of(node), message),
                    check_health=False,
                )
                receivers = await conn.read_response()
            except ResponseError as exc:  # refused (an ACL, say): published to nobody
                raise BrokerUnavailable(f"Redis refused PUBLISH: {exc}") from exc
            except DOWN as exc:
                raise MaybeSent(f"Redis failed during PUBLISH: {exc}") from exc
        finally:
            await pool.release(conn)
        return int(receivers)

    async def live(self) -> list[str]:
        """The nodes whose last heartbeat (``P seen``) is younger than ``LIVE`` by Redis's
        clock: those a request to every node asks. Raises what Redis raises."""
        pipe = self._client().pipeline(transaction=False)
        pipe.time()
        pipe.zrange(self.prefix + "seen", 0, -1, withscores=True)
        (now_s, now_us), seen = await pipe.execute()
        now = now_s * 1000 + now_us // 1000
        return [
            n.decode() if isinstance(n, bytes) else str(n)
            for n, at in seen
            if now - float(at) <= LIVE * 1000
        ]

    async def silent(self, node: str, seconds: float) -> bool:
        """Whether ``node``'s last heartbeat (``P seen``, written by queues/lua.py's ``BEAT`` and
        kept a day, also past the node being taken for dead) is older than ``seconds`` by
        Redis's clock, or missing (it left, or never was). Raises what Redis raises."""
        pipe = self._client().pipeline(transaction=False)
        pipe.zscore(self.prefix + "seen", node)
        pipe.time()
        score, (now_s, now_us) = await pipe.execute()
        if score is None:
            return True
        return bool(now_s * 1000 + now_us // 1000 - float(score) > seconds * 1000)

    def heard(self, message: bytes) -> None:
        """A message on this node's channel (the broker's reader hands it over)."""
        raw, _, body = message.partition(b"\n")
        try:
            head = orjson.loads(raw)
        except orjson.JSONDecodeError:
            log.warning("a node message that is not JSON: %r", raw[:80])
            return
        if "re" in head:
            fut = self._asks.get(head["re"])
            if fut is not None and not fut.done():
                fut.set_result((head, body))
            return
        if "t" in head:  # told: handled here and now, so in the order it came
            told = self._told.get(head.get("op", ""))
            if told is None:
                log.warning("a told %r nobody hears", head.get("op"))
                return
            try:
                told(str(head.get("from")), body)
            except Exception:
                log.exception("hearing %s from node %s", head.get("op"), head.get("from"))
            return
        task = asyncio.get_running_loop().create_task(self._answer(head, body))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, head: Head, body: bytes) -> None:
        handler = self._handlers.get(head.get("op", ""))
        try:
            if handler is None:
                raise LookupError(f"no handler for {head.get('op')!r}")
            reply, data = await handler(head, body)
        except Exception as exc:  # the asking node gets the reason, this one a log line
            log.exception("answering %s from node %s", head.get("op"), head.get("from"))
            reply, data = {"error": str(exc) or type(exc).__name__}, b""
        msg = orjson.dumps({**reply, "re": head.get("rid")}) + b"\n" + data
        asking = str(head.get("from"))
        for attempt in range(REPLY_TRIES):
            try:
                await self._publish(asking, msg)
                return
            except MaybeSent as exc:
                # the connection died under the PUBLISH (one left from before a Redis restart,
                # say) and redis-py dropped it: sent again on another, as a reply may be (the
                # asking node takes the first and ignores the rest)
                if attempt + 1 < REPLY_TRIES:
                    continue
                log.warning("cannot reply to node %s: %s", head.get("from"), exc)
            except Exception as exc:  # Redis away: the asking node times out
                log.warning("cannot reply to node %s: %s", head.get("from"), exc)
                return

    def close(self) -> None:
        """Fail what waits for a reply; stop answering."""
        self.tells.close()
        for task in self._tasks:
            task.cancel()
        for fut in self._asks.values():
            if not fut.done():
                fut.set_exception(Abandoned("this node is stopping"))
