"""``ShardedSubscriber``: sharded pub/sub on a Redis Cluster, one subscriber connection per
master (link.py), and a report of every channel whose hearing may have missed messages.

A sharded channel (``SSUBSCRIBE``, ``SPUBLISH``) lives on the master of its slot, as a key
does: a message published there reaches the subscribers connected to that master only. So
each followed channel is subscribed on its slot's master, and the caller learns, through
``lost``, of every channel that was not heard for a while, to read what it missed from the
history the scripts keep:

- a master's subscriber connection failed (the master stopped, stalled, failed over): once
  connected again (to the same master, or to the one the map names now), its channels are
  subscribed again, and reported lost when Redis has confirmed them;
- the channel's slot moved to another master (a resharding): Redis 7 unsubscribes the
  subscribers of its channels itself (an unasked ``sunsubscribe``). The channel is
  subscribed on the new owner and reported lost there. A message published on the new owner
  before that (by a script that ran there, sent by ``ASK`` during the migration, or after)
  was not heard.

``lost`` is called once the channels are heard again, so that a read of their history then
misses nothing; ``deaf``, if given, as soon as they are not (the caller may hold what it
hears of them meanwhile). A fresh ``follow`` reports nothing: the caller reads the history
once ``follow`` returns, as it would have to anyway.

Messages are handed to ``heard`` in the reader's own callback, in the order their
connection received them (one master's channels in Redis's order; no order between masters).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .address import Address
from .answers import MOVED, kind_of, redirect
from .client import ShardedClient
from .link import BACKOFF, Link
from .partitions import key_slot

log = logging.getLogger("rubris_asgi.broker")

PING_EVERY = 2.0
"""Seconds between a subscriber connection's PINGs: how soon a silent master is checked."""
PING_TIMEOUT = 3.0
"""Seconds a PING's answer is waited for before the connection counts as failed: longer than
any pause of a live master but a stall (a fork for a snapshot, a slow disk under
``appendfsync always``), short enough that a stalled master is left within ``PING_EVERY`` +
``PING_TIMEOUT``."""
CONFIRM_TIMEOUT = 5.0
"""Seconds ``follow`` waits for Redis to confirm a subscription."""

Heard = Callable[[bytes, bytes], None]
Lost = Callable[[list[bytes]], None]


class ShardedSubscriber:
    """The followed sharded channels, each subscribed on its slot's master.

    Args:
        client: the sharded client whose map routes the channels (and whose credentials the
            connections use); it is not closed with the subscriber.
        heard: ``heard(channel, data)`` for each message of a followed channel.
        lost: ``lost(channels)``: these channels are heard again after a time they may have
            missed messages (see the module's docstring).
        deaf: ``deaf(channels)``, optional: these channels are not heard from now on, until
            they are reported ``lost``.
    """

    def __init__(
        self,
        client: ShardedClient,
        heard: Heard,
        lost: Lost,
        *,
        deaf: Lost | None = None,
        ping_every: float = PING_EVERY,
        ping_timeout: float = PING_TIMEOUT,
        confirm_timeout: float = CONFIRM_TIMEOUT,
    ) -> None:
        self.client = client
        self.ping_every = ping_every
        self.ping_timeout = ping_timeout
        self.confirm_timeout = confirm_timeout
        self._heard = heard
        self._lost = lost
        self._deaf = deaf
        self._links: dict[Address, Link] = {}
        """One per master that serves a followed channel (or did): bounded by the masters."""
        self._where: dict[bytes, Link] = {}
        """Each followed channel's link; a channel between two (its slot moved, its
        subscription refused) is in ``_moving`` instead."""
        self._interrupted: set[bytes] = set()
        """Followed channels not heard for a while: reported ``lost`` when heard again."""
        self._waiting: dict[bytes, asyncio.Future[None]] = {}
        """What a ``follow`` waits for, per channel not confirmed yet: one each."""
        self._fresh: set[bytes] = set()
        """Channels followed and never confirmed yet: nothing of them was heard, so nothing
        was lost; a failure before their confirmation ends their ``follow`` instead."""
        self._moving: set[bytes] = set()
        self._mover: asyncio.Task[None] | None = None
        self._closed = False

    # the API

    def following(self, channel: str | bytes) -> bool:
        return _bytes(channel) in self._where or _bytes(channel) in self._moving

    def heard_now(self, channel: str | bytes) -> bool:
        """Whether ``channel`` is subscribed on its master now (confirmed by Redis)."""
        link = self._where.get(_bytes(channel))
        return link is not None and _bytes(channel) in link.confirmed

    async def follow(self, channel: str | bytes) -> None:
        """Subscribe to ``channel`` on its slot's master and return once Redis confirmed it
        (idempotent: a channel followed already returns once heard). Raises
        ``ConnectionError`` at once when that master's subscriber connection is down,
        ``TimeoutError`` (both ``nodes.DOWN``) when Redis did not confirm within
        ``confirm_timeout``, ``SlotsRefused`` when no master serves the slot by the map. A
        channel this call began to follow is then not followed; one followed before stays
        (it is reported ``lost`` once heard again)."""
        if self._closed:
            raise RedisConnectionError("the sharded subscriber is closed")
        ch = _bytes(channel)
        link = self._where.get(ch)
        if link is not None and ch in link.confirmed:
            return
        known = link is not None or ch in self._moving
        if not known:
            self._fresh.add(ch)
            try:
                link = self._assign(ch, self.client.owner(key_slot(ch)))
            except BaseException:
                self.unfollow(ch)
                raise
        fut = self._waiting.get(ch)
        if fut is None:
            fut = self._waiting[ch] = asyncio.get_running_loop().create_future()
        if link is not None and link.failing:
            self._give_up(ch, fut)
            raise RedisConnectionError(
                f"the subscriber connection to {link.address[0]}:{link.address[1]} is down"
            )
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.confirm_timeout)
        except asyncio.TimeoutError:
            self._give_up(ch, fut)
            raise RedisTimeoutError(
                f"Redis did not confirm SSUBSCRIBE {ch!r} within {self.confirm_timeout:g} s"
            ) from None
        except BaseException:
            if not fut.done():  # cancelled
                self._give_up(ch, fut)
            raise

    def _give_up(self, channel: bytes, fut: asyncio.Future[None]) -> None:
        """A ``follow`` of ``channel`` ends unconfirmed: a channel it began to follow is
        unfollowed (another ``follow`` waiting for it too fails); one followed before stays,
        its future resolved by the confirmation to come (or dropped by ``unfollow``)."""
        if channel in self._fresh and self._waiting.get(channel) is fut:
            self.unfollow(channel)

    def unfollow(self, channel: str | bytes) -> None:
        """Stop hearing ``channel`` (idempotent): nothing of it is handed over from now on,
        and its subscription is ended on its master."""
        ch = _bytes(channel)
        self._interrupted.discard(ch)
        self._fresh.discard(ch)
        self._moving.discard(ch)
        link = self._where.pop(ch, None)
        if link is not None:
            link.remove(ch)
        fut = self._waiting.pop(ch, None)
        if fut is not None and not fut.done():
            fut.set_exception(RedisConnectionError(f"{ch!r} was unfollowed"))
            fut.exception()  # retrieved: the follow that waited may be gone

    async def close(self) -> None:
        """Stop every connection and task; what waits in ``follow`` fails."""
        self._closed = True
        mover, self._mover = self._mover, None
        if mover is not None:
            mover.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await mover
        links, self._links = list(self._links.values()), {}
        for link in links:
            await link.close()
        for ch in list(self._waiting):
            self.unfollow(ch)
        self._where.clear()
        self._moving.clear()

    # what the links tell

    def message(self, channel: bytes, data: bytes) -> None:
        if channel not in self._where:
            return  # unfollowed meanwhile
        try:
            self._heard(channel, data)
        except Exception:
            log.exception("hearing a message of %r", channel)

    def confirmed(self, link: Link, channel: bytes) -> bool:
        """Redis confirmed ``channel`` on ``link``: whether to report it lost."""
        if self._where.get(channel) is not link:
            return False
        self._fresh.discard(channel)
        fut = self._waiting.pop(channel, None)
        if fut is not None and not fut.done():
            fut.set_result(None)
        return channel in self._interrupted

    def report_lost(self, channels: list[bytes]) -> None:
        """``channels`` are heard again: reported lost (they stay interrupted until this)."""
        channels = [c for c in channels if c in self._interrupted and c in self._where]
        self._interrupted.difference_update(channels)
        if channels:
            _call(self._lost, channels, "lost")

    def link_failed(self, link: Link) -> None:
        """``link``'s connection failed: its channels are not heard until it is back, and a
        ``follow`` that began one and waits for its confirmation fails now
        (``ConnectionError``)."""
        for ch in sorted(c for c in link.channels if c in self._fresh):
            fut = self._waiting.pop(ch, None)
            if fut is not None and not fut.done():
                fut.set_exception(
                    RedisConnectionError(
                        f"the subscriber connection to {link.address[0]}:{link.address[1]} "
                        f"failed before Redis confirmed {ch!r}"
                    )
                )
                fut.exception()  # retrieved: the follow that waited may be gone
            self.unfollow(ch)
        deaf = sorted(c for c in link.channels if self._where.get(c) is link)
        fresh = [c for c in deaf if c not in self._interrupted]
        self._interrupted.update(deaf)
        if fresh and self._deaf is not None:
            _call(self._deaf, fresh, "deaf")

    def rerouted(self, link: Link) -> bool:
        """After ``link`` failed and the map was read again: its channels whose slot another
        master serves now go there. Whether the link goes on (it serves a channel, or its
        node is still a master)."""
        for ch in sorted(link.channels):
            owner = self.client.slot_map.owner(key_slot(ch))
            if owner is not None and owner != link.address:
                link.channels.discard(ch)
                self._assign(ch, owner)
        if link.channels or link.address in self.client.slot_map.masters or self._closed:
            return not self._closed
        if self._links.get(link.address) is link:
            del self._links[link.address]
        return False

    def dropped(self, link: Link, channel: bytes) -> None:
        """Redis unsubscribed ``channel`` on ``link`` itself: its slot left that master."""
        if self._where.get(channel) is not link:
            return
        del self._where[channel]
        if channel not in self._fresh and channel not in self._interrupted:
            self._interrupted.add(channel)
            if self._deaf is not None:
                _call(self._deaf, [channel], "deaf")
        self._move(channel)

    def refused(self, link: Link, channel: bytes, exc: ResponseError) -> None:
        """Redis refused ``SSUBSCRIBE channel`` on ``link``: ``MOVED`` sends it to the master
        named (which the map takes); anything else (``CLUSTERDOWN``, say) is tried again
        after the map is read again, with a pause."""
        if self._where.get(channel) is not link:
            return
        del self._where[channel]
        kind = kind_of(exc)
        if kind == MOVED:
            where = redirect(exc, kind, link.address)
            if where is not None:
                self.client.slot_map.moved(where.slot, where.address)
                self.client.refresh_soon()
                self._assign(channel, where.address)
                return
        log.warning("SSUBSCRIBE %r refused by %s:%d: %s", channel, *link.address, exc)
        self._move(channel)

    # routing

    def _assign(self, channel: bytes, address: Address) -> Link:
        link = self._links.get(address)
        if link is None or link.done:
            link = self._links[address] = Link(self, address)
        self._where[channel] = link
        link.add(channel)
        return link

    def _move(self, channel: bytes) -> None:
        """Subscribe ``channel`` where the map read next says (``_mover``)."""
        self._moving.add(channel)
        if self._mover is None or self._mover.done():
            self._mover = asyncio.get_running_loop().create_task(
                self._moves(), name="rubris-shards-mover"
            )

    async def _moves(self) -> None:
        delay = BACKOFF[0]
        while self._moving and not self._closed:
            await self.client.refresh()  # bounded: refresh_timeout
            moving, self._moving = self._moving, set()
            for ch in sorted(moving):
                owner = self.client.slot_map.owner(key_slot(ch))
                if owner is None:
                    self._moving.add(ch)
                else:
                    self._assign(ch, owner)
            if self._moving:
                await asyncio.sleep(delay)
                delay = min(2 * delay, BACKOFF[1])


def _bytes(channel: str | bytes) -> bytes:
    return channel.encode() if isinstance(channel, str) else channel


def _call(callback: Lost, channels: list[bytes], what: str) -> None:
    try:
        callback(channels)
    except Exception:
        log.exception("the %s callback failed", what)
