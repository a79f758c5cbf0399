"""What the Client PUBLISHes: the ``_Producing`` mixin of Client.

:meth:`~_Producing.publish` does not wait for the server's answer (awaited, it returns once
the PUBLISH is queued to send; a refusal comes back later, to ``on_refused``);
:meth:`~_Producing.enqueue` and :meth:`~_Producing.enqueue_many` put work items in a queue
topic and wait for each one's outcome, which :class:`~.outcomes._Outcomes` tells them (the PONG
of a PING sent behind the PUBLISHes, or their REJECTED). Both are paced by the server's FLOW
through ``publish_limiter``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import orjson

from ..control.ratelimit import RateLimiter
from ..errors import ErrorCode, ProtocolError
from ..protocol import ClientMessage, Ping, Publish, Welcome, encode
from ..protocol.naming import quoted, value_refused
from .errors import ItemRefused, OutcomeUnknown, _lost
from .outbox import _Outbox
from .outcomes import ENQUEUE_WINDOW, PUBLISHES_KEPT, _Batch, _Outcomes
from .stats import ClientStats
from .supervisor import State


class _Producing:
    """publish(), enqueue() and enqueue_many(); mixed into :class:`~.core.Client`.

    The attributes and methods below are the Client's, declared here for the type checker.
    """

    state: State
    welcome: Welcome | None
    error: BaseException | None
    stats: ClientStats
    publish_limiter: RateLimiter
    _reqs: itertools.count[int]
    _tokens: itertools.count[int]
    _outbox: _Outbox
    _pub_reqs: OrderedDict[int, tuple[str, Any]]
    _outcomes: _Outcomes
    _send: Callable[[ClientMessage], Coroutine[Any, Any, None]]
    _control: Callable[[ClientMessage], None]

    async def publish(self, name: str, value: Any) -> None:
        """PUBLISH ``value`` (JSON) to ``name``: awaited (a coroutine that is not awaited sends
        nothing), it returns once the message is queued to send, without waiting for the
        server's answer.

        A refusal arrives later: a :class:`Rejection` with the topic and the ``value`` is kept
        in :attr:`rejections` (the last 100) and handed to ``on_refused`` (every one), counted
        in ``stats.rejected``; one WARNING line sums them up every 5 s at most. The values of
        the last ``PUBLISHES_KEPT`` (1,024) publishes are kept to do that. To learn each
        item's outcome, use :meth:`enqueue`.

        Paced by :attr:`publish_limiter`: the server sends FLOW when its intake (or, for a
        queue topic, the queue) fills, and this waits as long as the lowered rate asks (no
        wait at all while it does not).

        Raises ``TypeError`` naming ``name``, the type and the fix when ``value`` is not JSON
        (nothing sent, nothing counted).
        """
        # encoded first: a value that is not JSON takes no pacing token and no request number
        try:
            data = orjson.dumps(value)
        except TypeError as exc:
            raise value_refused(f"publish to {quoted(name)}", exc) from exc
        await self.publish_limiter.acquire()
        req = next(self._reqs)
        self._pub_reqs[req] = (name, value)
        while len(self._pub_reqs) > PUBLISHES_KEPT:
            self._pub_reqs.popitem(last=False)
        await self._send(Publish(req, name, data))

    async def enqueue(self, name: str, value: Any) -> None:
        """PUBLISH the work item ``value`` (JSON) to the queue topic ``name`` and wait until the
        server took it, or refused it.

        Returns when the item is in the queue. Many may be in flight at once (tasks,
        ``asyncio.gather``): the enqueues of one event-loop turn share one PING, whose PONG
        tells each that the server took it (protocol.md section 4). At most
        ``ENQUEUE_WINDOW`` (1,024) wait for their outcome; more wait for room first. Paced by
        :attr:`publish_limiter` as :meth:`publish` is: the server sends FLOW as the queue
        fills (50, 75, 87, 100 %), so a producer slows down before anything is refused.

        Raises:
            ItemRefused: the server refused the item (``code`` 6 when the queue is full,
                ``reason`` naming the queue and its fill; 3 when ``name`` takes no PUBLISH):
                nothing was queued.
            OutcomeUnknown: the connection was lost after the PUBLISH left the client and
                before its outcome came back: the item may be queued or not.
            ConnectionLost: the client closed (or was closed) before the PUBLISH was sent:
                nothing was queued.
            ProtocolError: the PUBLISH is over the server's ``max_frame`` (nothing sent).
            TypeError: ``value`` is not JSON-serialisable (nothing sent); the message names
                ``name``, the type and the fix.
        """
        refused = await self._enqueue(name, [value], True)
        assert not refused  # a single item's refusal is raised

    async def enqueue_many(self, name: str, values: Iterable[Any]) -> list[ItemRefused]:
        """:meth:`enqueue` for many items at once: PUBLISH each of ``values`` (JSON) to the
        queue topic ``name``, in order, and wait until the server took or refused every one.

        Returns the refusals (``ItemRefused``, ``index`` its place in ``values``), in order;
        an empty list when the queue took them all. One call for many items is the cheap way to
        enqueue fast: one wait, one PING per event-loop turn, no task per item. More than
        ``ENQUEUE_WINDOW`` (1,024) values go in runs of that many, each run waited for before
        the next is sent.

        Raises:
            OutcomeUnknown: the connection was lost before some outcomes came back; its
                ``value`` lists those values (the others were taken or refused: the refusals
                of that run are lost with the exception, so send items with an identity).
            ConnectionLost: the client closed before any of a run was sent (nothing of it
                queued; earlier runs were).
            ProtocolError: an item is over the server's ``max_frame`` (nothing of its run
                sent).
            TypeError: a value is not JSON-serialisable (nothing of its run sent); the message
                names ``name``, the value's index in ``values``, the type and the fix.
        """
        items = list(values)
        refused: list[ItemRefused] = []
        for start in range(0, len(items), ENQUEUE_WINDOW):
            run = items[start : start + ENQUEUE_WINDOW]
            for r in await self._enqueue(name, run, False, start):
                r.index += start
                refused.append(r)
        return refused

    async def _enqueue(
        self, name: str, values: list[Any], single: bool, start: int = 0
    ) -> list[ItemRefused]:
        """PUBLISH ``values`` (at most ``ENQUEUE_WINDOW``; the first is item ``start`` of
        ``enqueue_many``'s) and wait for their outcomes."""
        if not values:
            return []
        # everything checked before anything is sent: a run is sent whole or not at all
        msgs: list[tuple[Publish, bytes]] = []
        limit = self.welcome.max_frame if self.welcome is not None else 0
        for value in values:
            try:
                payload = orjson.dumps(value)
            except TypeError as exc:  # nothing of the run is sent
                what = f"enqueue to {quoted(name)}"
                if not single:
                    what += f" (values[{start + len(msgs)}])"
                raise value_refused(what, exc) from exc
            msg = Publish(next(self._reqs), name, payload)
            data = encode(msg)
            if limit and len(data) > limit:
                raise ProtocolError(
                    f"PUBLISH of {len(data)} bytes is over the server's max_frame of {limit}",
                    ErrorCode.TOO_LARGE,
                )
            msgs.append((msg, data))
        outcomes = self._outcomes
        n = len(values)
        await outcomes.window.take(n)
        try:
            if self.state == "closed" or self._outbox.closed is not None:
                raise _lost("the client is closed", self.error)
            await self.publish_limiter.acquire(n)
            fut: asyncio.Future[list[ItemRefused]] = asyncio.get_running_loop().create_future()
            batch = _Batch(fut, name, values, single)
            outbox = self._outbox
            for i, item in enumerate(msgs):
                await outbox.put(item)
                # in the outbox now, so the turn's PING goes behind it: nothing ran in between
                outcomes.sent(item[0].req, batch, i)
            try:
                return await fut
            except OutcomeUnknown:
                self.stats.unknown += 1
                raise
            except asyncio.CancelledError:
                outcomes.abandon(batch)
                raise
        finally:
            outcomes.window.give(n)

    def _outcome_ping(self) -> int:
        """A PING behind everything in the outbox, for :meth:`enqueue`'s outcomes."""
        token = next(self._tokens)
        self._control(Ping(token))
        self.stats.outcome_pings += 1
        return token

    def _unsent(self) -> tuple[set[int], set[int]]:
        """The PUBLISH requests and PING tokens still in the outbox (not handed to a link)."""
        reqs: set[int] = set()
        tokens: set[int] = set()
        for msg, _ in self._outbox.items:
            if isinstance(msg, Publish):
                reqs.add(msg.req)
            elif isinstance(msg, Ping):
                tokens.add(msg.token)
        return reqs, tokens
