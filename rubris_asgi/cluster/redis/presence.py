"""``RedisPresence``: the members of watched topics added up across nodes (a ``PresenceBook``).

Each node counts its own sessions per member (engine/keyed/presence.py's ``Members`` tells it
each +1 and -1); this book keeps that count and writes it to Redis *whole* (this node has n
sessions of that member now), in batches: one script (``presence_lua.COUNTS``) per batch adds
every node's counts up and makes the member's ``{topic}@presence`` entry (``{"sessions": n,
"info": …}``, deleted when the total reaches 0) and ``{topic}@count`` change, numbered like
any change, so every node that follows them hears it. A member that joins and leaves between
two batches costs nothing; a burst of 1,000 joins is a few script calls.

Counts written whole make every write idempotent: a batch sent again counts the same, and a
node whose counts Redis lost (restarted without its data, or swept as dead while it was only
paused) writes everything it holds again (*registers*) and is exact again. A node found dead
(its heartbeat, queues/lua.py's ``BEAT``, older than ``node_timeout`` less a beat) has its counts
taken away by whichever node sweeps first (``presence_lua.SWEEP``, every beat on each node):
its members are gone within ``node_timeout`` of its last heartbeat, so of its death. A node
that stops takes its own away. A resume is not a leave: the session keeps its subscriptions
(the engine's rule), and this book never hears of it.

Bounds: what waits to be written is one count per (topic, member) this node holds or just
dropped, ``BATCH`` of them a script; a presence topic lists at most ``Limits.max_keys``
members (beyond, they are counted, not listed).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from ...engine.membership import EngineEvents
from ...engine.topics import new_epoch
from ...errors import BrokerUnavailable
from . import presence_lua
from .nodes import RETRIED
from .queues.home import BEAT
from .reach import Reach, end_if_cancelled

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("rubris_asgi.broker")

BATCH = 256
"""Member counts in one script call at most (about 15 us of Redis's time each)."""
REFRESH = 60.0
"""Seconds between refreshes of the expiry of the presence keys this node has members in."""


class Carrier(Protocol):
    """What the presence book needs of its broker (``RedisBroker``)."""

    prefix: str
    node: str
    ttl_ms: str
    reach: Reach

    @property
    def redis(self) -> Redis: ...


class RedisPresence:
    """This node's members of every watched topic, written to the Redis all nodes share."""

    def __init__(self, broker: Carrier, node_timeout: float) -> None:
        self.broker = broker
        self.prefix = broker.prefix
        self.node = broker.node
        # a heartbeat older than this is a dead node's: a beat less than the queues' lapse,
        # so that its members are gone within node_timeout of its death, swept once a beat
        self.lapse_ms = str(int((node_timeout - BEAT) * 1000))
        # as queues/lua.py's: nobody at all beat for this long, Redis itself was away
        self.pause_ms = str(int(min(node_timeout / 2, 2.5 * BEAT) * 1000))
        self.counts: dict[str, dict[str, list[Any]]] = {}
        """topic → member → [this node's sessions of it, its info as JSON]."""
        self.dirty: dict[tuple[str, str], None] = {}
        """(topic, member) whose count Redis has not been told yet, in order."""
        self.registered = False
        """Whether Redis holds this node's counts (else the next batch writes them all)."""
        self._held_back = False
        """Redis would not take this node's counts (not registered, and not yet in the nodes'
        table): nothing is written until the sweep says it may register."""
        self.swept = 0
        """Dead nodes whose members this node took away."""
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._scripts: dict[str, Any] = {}
        self._fixed: list[Any] = []
        self._clock: Callable[[], float] = time.monotonic

    # life

    async def start(self, events: EngineEvents) -> None:
        redis = self.broker.redis
        for name in ("COUNTS", "SWEEP", "LEAVE"):
            self._scripts[name] = redis.register_script(getattr(presence_lua, name))
        config = events.config
        self._clock = events.clock
        # the tombstone window and the presence topics' max_keys: every script's last two
        self._fixed = [int(config.timing.tombstones * 1000), config.limits.max_keys]
        self._tasks = [
            asyncio.create_task(self._write_loop(), name="rubris-presence-writer"),
            asyncio.create_task(self._sweep_loop(), name="rubris-presence-sweep"),
        ]

    async def stop(self, flush: float) -> None:
        """Take this node's members away in Redis (within ``flush`` seconds), and stop."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if not self._tasks:
            return
        self._tasks = []
        args = [self.prefix, self.node, self.broker.ttl_ms, str(new_epoch()), *self._fixed]

        async def leave() -> None:
            while not int(await self._scripts["LEAVE"](args=args)):
                pass  # a budget a call: more of them

        try:
            await asyncio.wait_for(leave(), flush)
        except Exception:  # the others sweep them once this node's heartbeat lapses
            log.warning("this node's members could not be taken away at its stop", exc_info=True)

    @property
    def pending(self) -> int:
        """Member counts waiting to be written."""
        return len(self.dirty)

    # the engine's side (PresenceBook)

    def changed(self, topic: str, member: str, delta: int, info: Any) -> None:
        members = self.counts.get(topic)
        if members is None:
            members = self.counts[topic] = {}
        held = members.get(member)
        if held is None:
            held = members[member] = [0, _json(info, topic)]
        held[0] += delta
        if held[0] <= 0:
            del members[member]
            if not members:
                del self.counts[topic]
        self.dirty[(topic, member)] = None
        self._wake.set()

    # Redis's side

    async def _write_loop(self) -> None:
        dirty = self.dirty
        while True:
            # a cancel redis-py swallowed in the last call (it may answer it, too) would
            # otherwise leave this loop waiting for ever, and the stop waiting for it
            end_if_cancelled()
            if self._held_back or not dirty and (self.registered or not self.counts):
                self._wake.clear()
                await self._wake.wait()
            register = not self.registered
            if register:  # everything it holds, in this batch and the next ones
                for topic, members in self.counts.items():
                    for member in members:
                        dirty[(topic, member)] = None
            batch = list(itertools.islice(dirty, BATCH))
            for key in batch:
                del dirty[key]
            try:
                written = await self._write(batch, register)
            except Exception:  # a script error: a bug, never a reason to stop
                end_if_cancelled()
                log.exception("Redis refused %d presence counts", len(batch))
                continue
            if written:
                self.registered = True
            else:  # its counts are not there any more: written again when the sweep says
                for key in batch:
                    dirty[key] = None
                self.registered = False
                self._held_back = True

    async def _write(self, batch: list[tuple[str, str]], register: bool) -> bool:
        args: list[Any] = [
            self.prefix,
            self.node,
            self.broker.ttl_ms,
            str(new_epoch()),
            *self._fixed,
            int(register),
        ]
        by_topic: dict[str, list[str]] = {}
        for topic, member in batch:
            by_topic.setdefault(topic, []).append(member)
        for topic, names in by_topic.items():
            members = self.counts.get(topic, {})
            args += (topic, len(names))
            for member in names:
                held = members.get(member)
                args += (member, 0, b"") if held is None else (member, held[0], held[1])
        answer = await self.broker.reach.until_answered(
            lambda: self._scripts["COUNTS"](args=args), "presence"
        )
        return bool(int(answer))

    async def _sweep_loop(self) -> None:
        """Every heartbeat: the dead nodes' members taken away, and whether this node's are
        still there; every ``REFRESH`` its keys' expiry pushed back."""
        refreshed = self._clock()
        more = False
        while True:
            end_if_cancelled()  # as in _write_loop
            if not more:
                await asyncio.sleep(BEAT)
            touch: list[str] = []
            if self._clock() - refreshed >= REFRESH:
                refreshed = self._clock()
                touch = list(self.counts)
            args = [
                self.prefix,
                self.node,
                self.lapse_ms,
                self.pause_ms,
                self.broker.ttl_ms,
                str(new_epoch()),
                *self._fixed,
                *touch,
            ]
            more = False
            try:
                answer = await self._scripts["SWEEP"](args=args)
            except (*RETRIED, BrokerUnavailable):
                end_if_cancelled()
                continue  # the next beat tries again
            except Exception:
                end_if_cancelled()
                log.exception("presence sweep failed")
                continue
            more = bool(int(answer[2]))  # a dead node's members left to take away: at once
            if int(answer[1]):
                self.swept += int(answer[1])
                log.warning("presence: the members of %d dead nodes taken away", int(answer[1]))
            known = int(answer[0])
            if known == 0 and (self.registered or self._held_back) and self.counts:
                # taken for dead (paused past node_timeout), or Redis lost every count
                log.warning("presence: Redis holds none of this node's members: written again")
                self.registered = self._held_back = False
                self._wake.set()
            elif known == 1 and self._held_back:
                self._held_back = False
                self._wake.set()


def _json(info: Any, topic: str) -> bytes:
    """A member's ``info`` as JSON (what the application's hook returned)."""
    try:
        return orjson.dumps(info)
    except TypeError:
        log.error("presence_info for %r returned a value JSON cannot carry: %r", topic, info)
        return b"null"


__all__ = ["RedisPresence"]
