"""A queue's recent producers and the FLOW level they were last told (protocol.md section 8).

Clients that enqueue work items with PUBLISH are told how full the queue is, as publishers are
told the intake's fill: a session that PUBLISHed to the queue within the last second
(``intake.RECENT``) gets FLOW(fill) when the fill crosses 50, 75, 87 or 100 % upward, and
FLOW(fill) once more when it falls back below 50 % (``intake.flow_level``, ``FLOW_LEVELS``).
So a producer slows down (its client's rate limiter takes FLOW as a NAK) before the queue
refuses anything.

A queue's **fill** is its waiting items over ``max_length``, 0-100 %: the items in ``ready``
alone, or what its home (Redis) holds for it as this node last heard, plus what this node has
not sent there yet. The engine makes a ``QueueProducers`` for a queue at its first client
PUBLISH; ``published`` is called after each one (O(1)), ``check`` where the fill may fall (the
deal, in the scheduler's cycle, and for a queue with a home the engine's queue tick).
In-process ``enqueue`` has no producer session to tell and never comes here.

Bounded: publishers older than ``RECENT`` are forgotten whenever a FLOW goes out, so the table
holds the sessions that published lately, at most every session of the server.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from ..intake import FlowWatch


class QueueProducers:
    """The sessions that PUBLISHed to one queue lately, and the FLOW level last sent to them.

    Args:
        capacity: the queue's ``max_length`` (100 % fill).
        waiting: the queue's waiting items now (O(1)).
        flow: ``f(fill, publishers)``, called when the fill crosses a FLOW level upward or
            falls back below 50 %, with the publishers of the last ``RECENT`` seconds.
        clock: a monotonic clock.

    >>> told = []
    >>> waiting = [0]
    >>> p = QueueProducers(10, lambda: waiting[0], flow=lambda f, ps: told.append((f, ps)),
    ...                    clock=lambda: 0.0)
    >>> waiting[0] = 5; p.published("s1")
    >>> waiting[0] = 6; p.published("s1")  # still at the 50 % level: nothing new
    >>> waiting[0] = 2; p.check()
    >>> told
    [(50, ['s1']), (20, ['s1'])]
    """

    __slots__ = ("capacity", "watch", "_waiting")

    def __init__(
        self,
        capacity: int,
        waiting: Callable[[], int],
        *,
        flow: Callable[[int, list[Hashable]], None],
        clock: Callable[[], float],
    ) -> None:
        self.capacity = capacity
        self.watch = FlowWatch(flow, clock)
        """The producers of the last second and the level they were told (intake.py's rule)."""
        self._waiting = waiting

    @property
    def fill(self) -> int:
        """How full the queue is, 0-100 %."""
        return min(100, self._waiting() * 100 // self.capacity)

    def published(self, producer: Hashable) -> None:
        """``producer`` PUBLISHed an item that the queue took: remember it, check the level."""
        self.watch.published(producer)
        self.check()

    def refused(self, producer: Hashable) -> None:
        """``producer``'s PUBLISH was refused: it still counts as a recent producer (it is
        told when the queue falls back below 50 %)."""
        self.watch.published(producer)

    def check(self) -> None:
        """Send FLOW if the fill crossed a level since the last check (O(1) when it did not)."""
        self.watch.check(self.fill)
