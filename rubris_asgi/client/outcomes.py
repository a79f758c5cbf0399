"""What a producing client keeps of its PUBLISHes: each ``enqueue()`` waiting for its outcome,
and what ``publish()``'s refusals are tied to (protocol.md section 4: REJECTED, or the PONG of a
later PING, answers a PUBLISH). The reader (handlers.py) feeds it; ``Client.enqueue`` and
``Client.enqueue_many`` (core.py) wait on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import ItemRefused, OutcomeUnknown, _lost, _subject

__all__ = ["ENQUEUE_WINDOW", "PUBLISHES_KEPT", "Rejection"]

log = logging.getLogger("rubris_asgi.client")

PUBLISHES_KEPT = 1024
"""``publish()`` calls whose topic and value the client keeps, the newest, to tie a refusal to
its item (:class:`Rejection`); a refusal of an older one has ``name`` "" and ``value`` None."""
ENQUEUE_WINDOW = 1024
"""``enqueue()`` calls waiting for their outcome at most; more wait for room first."""
REFUSALS_LOGGED_EVERY = 5.0
"""Seconds between the WARNING lines that sum up ``publish()``'s refusals."""


@dataclass(frozen=True)
class Rejection:
    """A ``publish()`` the server refused: its request number, topic, the server's ``code``
    and ``reason``, and the ``value`` published. ``name`` is "" and ``value`` None when the
    request was older than the last ``PUBLISHES_KEPT`` (1,024) publishes.

    ``str()`` names the topic once, whatever the server's reason says: ``publish to 'chat'
    refused: not for you (code 10)``, ``publish refused: unknown topic 'chta' (code 3)``."""

    req: int
    name: str
    code: int
    reason: str
    value: Any = field(default=None, hash=False)

    def __str__(self) -> str:
        subject = _subject("publish", self.name, self.reason, "to ")
        return f"{subject} refused: {self.reason} (code {self.code})"


class _Batch:
    """The items of one ``enqueue()`` or ``enqueue_many()`` call, waiting for their outcomes.

    ``fut`` is done when every item has one: with the refusals (``ItemRefused``, in the
    order of the items) when each was taken or refused, with ``OutcomeUnknown`` when some
    outcome was lost with a connection, with ``ConnectionLost`` when none of them was sent. A
    single ``enqueue()`` raises its refusal instead of returning it.
    """

    __slots__ = ("fut", "topic", "values", "single", "left", "refused", "unknown", "unsent", "reqs")

    def __init__(
        self, fut: asyncio.Future[list[ItemRefused]], topic: str, values: list[Any], single: bool
    ) -> None:
        self.fut = fut
        self.topic = topic
        self.values = values
        self.single = single
        self.left = len(values)
        self.refused: list[ItemRefused] = []
        self.unknown: list[int] = []
        self.unsent: list[int] = []
        self.reqs: list[int] = []

    def settle(self, why: str = "", cause: BaseException | None = None) -> None:
        """One more item has its outcome; when it was the last, the caller is told."""
        self.left -= 1
        if self.left or self.fut.done():
            return
        if self.unknown:
            vals = [self.values[i] for i in sorted(self.unknown + self.unsent)]
            value: Any = vals[0] if self.single else vals
            message = f"the outcome of {len(vals)} item(s) for {self.topic!r} is unknown: {why}"
            self.fut.set_exception(OutcomeUnknown(message, self.topic, value))
        elif self.unsent:
            self.fut.set_exception(_lost(why, cause))
        elif self.single and self.refused:
            self.fut.set_exception(self.refused[0])
        else:
            self.fut.set_result(sorted(self.refused, key=lambda r: r.index))


class _Window:
    """At most ``limit`` items waiting for their outcome; callers wait for room."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._room = asyncio.Event()

    async def take(self, n: int) -> None:
        while self.used and self.used + n > self.limit:
            self._room.clear()
            await self._room.wait()
        self.used += n

    def give(self, n: int) -> None:
        self.used -= n
        self._room.set()


class _Outcomes:
    """The outcomes ``enqueue()`` waits for: REJECTED for its request, or a PING barrier.

    PUBLISH has no answer when it is taken, but the server handles one connection's messages
    in order and sends its direct answers (REJECTED, PONG) in that order: the PONG of a PING
    sent after a PUBLISH, with no REJECTED for the PUBLISH before it, means the server took it
    (protocol.md section 4). The PUBLISHes put in the outbox in one event-loop turn share one
    PING, sent at the end of the turn (``call_soon``), after all of them.

    A connection lost with the PUBLISH gone from the outbox (written, or being written) hides
    its outcome: ``OutcomeUnknown`` (the REJECTED or the PONG may have been lost with it, even
    when the session is resumed). One still in the outbox goes out on the next connection with
    its PING after it, and its outcome is learnt there. Bounded: ``ENQUEUE_WINDOW`` items
    waiting (``window``); the turn's list and the barriers hold only those.

    ``ping()`` sends a PING behind everything in the outbox and returns its token.
    """

    def __init__(self, ping: Callable[[], int], limit: int = ENQUEUE_WINDOW) -> None:
        self._ping = ping
        self.window = _Window(limit)
        self.waiting: dict[int, tuple[_Batch, int]] = {}
        """By PUBLISH request number, in the order they were put in the outbox: the call's
        items and the item's place among them."""
        self._turn: list[int] = []
        self._scheduled = False
        self.barriers: dict[int, list[int]] = {}
        """PING token -> the requests its PONG settles."""
        self._forgotten: OrderedDict[int, None] = OrderedDict()
        """Requests given up (outcome unknown, caller cancelled): a late REJECTED is theirs."""

    def sent(self, req: int, batch: _Batch, index: int) -> None:
        """The PUBLISH ``req`` of item ``index`` of ``batch`` is in the outbox now."""
        self.waiting[req] = (batch, index)
        batch.reqs.append(req)
        self._turn.append(req)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._barrier)

    def _barrier(self) -> None:
        """End of the turn: one PING behind this turn's PUBLISHes."""
        self._scheduled = False
        turn, self._turn = self._turn, []
        reqs = [r for r in turn if r in self.waiting]
        if reqs:
            self.barriers[self._ping()] = reqs

    def pong(self, token: int) -> int:
        """A PONG: the requests of its barrier not refused before it were taken (how many)."""
        reqs = self.barriers.pop(token, None)
        if reqs is None:
            return 0
        taken = 0
        waiting = self.waiting
        for req in reqs:
            entry = waiting.pop(req, None)
            if entry is not None:
                entry[0].settle()
                taken += 1
        return taken

    def rejected(self, req: int, code: int, reason: str) -> bool:
        """A REJECTED: True when it answers an ``enqueue()`` (refused, or given up)."""
        entry = self.waiting.pop(req, None)
        if entry is None:
            if req in self._forgotten:  # its outcome was given up: nobody to tell
                del self._forgotten[req]
                return True
            return False
        batch, i = entry
        batch.refused.append(ItemRefused(code, reason, batch.topic, batch.values[i], i))
        batch.settle()
        return True

    def abandon(self, batch: _Batch) -> None:
        """The caller stopped waiting (cancelled): forget its requests."""
        for req in batch.reqs:
            if self.waiting.pop(req, None) is not None:
                self._forget(req)

    def _forget(self, req: int) -> None:
        self._forgotten[req] = None
        while len(self._forgotten) > ENQUEUE_WINDOW:
            self._forgotten.popitem(last=False)

    def lost(self, unsent: set[int], pings: set[int], why: str) -> None:
        """The connection is lost: what left the outbox has an unknown outcome; what is still
        in it (``unsent`` requests, ``pings`` tokens) goes out on the next connection."""
        for req in [r for r in self.waiting if r not in unsent]:
            batch, i = self.waiting.pop(req)
            self._forget(req)
            batch.unknown.append(i)
            batch.settle(why)
        for token in [t for t in self.barriers if t not in pings]:
            del self.barriers[token]  # its PONG, if it ever comes, settles nothing more

    def close(self, unsent: set[int], why: str, cause: BaseException | None) -> None:
        """The client is closed: a PUBLISH never sent was not queued (``ConnectionLost``),
        one sent has an unknown outcome (and so has the whole call it belongs to)."""
        for req in list(self.waiting):
            batch, i = self.waiting.pop(req)
            if req in unsent:
                batch.unsent.append(i)
            else:
                self._forget(req)
                batch.unknown.append(i)
            batch.settle(why, cause)
        self.barriers.clear()
        self._turn.clear()


class _RefusalLog:
    """At most one WARNING line per ``REFUSALS_LOGGED_EVERY`` seconds about ``publish()``'s
    refusals: the first at once, then a sum of those that followed."""

    def __init__(self) -> None:
        self.count = 0
        self.last: Rejection | None = None
        self._timer: asyncio.TimerHandle | None = None

    def note(self, r: Rejection) -> None:
        if self._timer is None:
            log.warning("%s; further refusals are summed up every %g s", r, REFUSALS_LOGGED_EVERY)
            self._arm()
        else:
            self.count += 1
            self.last = r

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(REFUSALS_LOGGED_EVERY, self.flush)

    def flush(self, again: bool = True) -> None:
        """Log the sum of the refusals since the last line (if any); quiet ones disarm."""
        self._timer = None
        r = self.last
        if self.count and r is not None:
            log.warning(
                "%d PUBLISHes refused in the last %g s; last: %s",
                self.count,
                REFUSALS_LOGGED_EVERY,
                r,
            )
            self.count = 0
            self.last = None
            if again:
                self._arm()

    def close(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            self.flush(again=False)
