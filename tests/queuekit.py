"""Work-queue test kit: an engine with queue channels, consumers, and a virtual-time consumer."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rubris_asgi.engine.channels import Registry
from rubris_asgi.engine.engine import Engine
from rubris_asgi.engine.queues import QueueSettings, QueueSub, QueueTopic
from rubris_asgi.engine.session import Session
from rubris_asgi.protocol import Ack, Item, Message, Revoke, decode_frame

from .enginekit import FakeClock, RecordingSink, connect


def make_engine(**settings: Any) -> tuple[Engine, FakeClock, QueueTopic]:
    """An engine with the queue channel ``jobs.{kind}`` (``settings``) and ``jobs.dead``."""
    clock = FakeClock()
    engine = Engine(clock=clock)
    registry = Registry()
    registry.queue("jobs.dead", QueueSettings())(lambda s: None)
    registry.queue("jobs.{kind}", QueueSettings(**settings))(lambda s, kind: None)
    registry.freeze()
    found = registry.match("jobs.x")
    assert found is not None
    q = engine.queue_of("jobs.x", found[0], registry)
    return engine, clock, q


def consumer(
    engine: Engine, q: QueueTopic, prefetch: int | None = None, *, auto: bool = True
) -> tuple[Session, RecordingSink, QueueSub]:
    s, sink = connect(engine, auto=auto)
    sub = engine.subscribe_queue(s, q, 1, prefetch)
    return s, sink, sub


def run(engine: Engine) -> None:
    for _ in range(100):
        if not engine.scheduler.has_work():
            return
        engine.scheduler.run_cycle()
    raise AssertionError("the scheduler did not settle")


def items(sink: RecordingSink) -> list[Item]:
    """The ITEMs the sink received since the last call (and forget its frames)."""
    return [m for frame in sink.take() for m in frame if isinstance(m, Item)]


def revokes(sink: RecordingSink) -> list[int]:
    return [t for frame in sink.take() for m in frame if isinstance(m, Revoke) for t in m.tags]


def ack(engine: Engine, s: Session, q: QueueTopic, *tags: int) -> None:
    engine.ack(s, Ack.items(q.number, tags))


@dataclass
class SimConsumer:
    """A consumer in virtual time: frames reach it ``delay`` after the server sent them, it
    works through its items one at a time, ``work`` seconds each, and each ACK reaches the
    server ``delay`` after the item is done."""

    engine: Engine
    session: Session
    sink: RecordingSink
    sub: QueueSub
    delay: float
    work: float
    buffer: deque[tuple[float, Item]] = field(default_factory=deque)
    busy_until: float = 0.0
    busy: float = 0.0
    done: list[tuple[Item, float]] = field(default_factory=list)
    waits: list[tuple[float, float]] = field(default_factory=list)
    """(start time, time the item waited in this consumer's buffer) of each item worked."""
    revoked: set[int] = field(default_factory=set)


class Simulation:
    """Events on a virtual clock: deliveries, work, ACKs, and the server's cycles and ticks."""

    def __init__(self, engine: Engine, clock: FakeClock, tick: float = 0.005) -> None:
        self.engine = engine
        self.clock = clock
        self.events: list[tuple[float, int, Any]] = []
        self.seq = itertools.count()
        self.consumers: list[SimConsumer] = []
        self.tick = tick
        self.at(clock.now + tick, self._tick)

    def at(self, when: float, fn: Any, *args: Any) -> None:
        heapq.heappush(self.events, (when, next(self.seq), (fn, args)))

    def add(
        self, q: QueueTopic, delay: float, work: float, prefetch: int | None = None
    ) -> SimConsumer:
        s, sink, sub = consumer(self.engine, q, prefetch)
        c = SimConsumer(self.engine, s, sink, sub, delay, work)
        self.consumers.append(c)
        return c

    def _tick(self) -> None:
        self.engine.queue_tick()
        self.at(self.clock.now + self.tick, self._tick)

    def _arrive(self, c: SimConsumer, msgs: list[Message]) -> None:
        for m in msgs:
            if isinstance(m, Item):
                c.buffer.append((self.clock.now, m))
            elif isinstance(m, Revoke):
                gone = set(m.tags)
                c.revoked |= gone
                c.buffer = deque(x for x in c.buffer if x[1].tag not in gone)
        self._start(c)

    def _start(self, c: SimConsumer) -> None:
        now = self.clock.now
        if c.busy_until > now or not c.buffer:
            return
        arrived, item = c.buffer.popleft()
        c.waits.append((now, now - arrived))
        c.busy_until = now + c.work
        c.busy += c.work
        self.at(c.busy_until, self._finish, c, item)

    def _finish(self, c: SimConsumer, item: Item) -> None:
        c.done.append((item, self.clock.now))
        self.at(self.clock.now + c.delay, self._ack, c, item.tag)
        self._start(c)

    def _ack(self, c: SimConsumer, tag: int) -> None:
        self.engine.ack(c.session, Ack.items(c.sub.number, (tag,)))

    def run_until(self, end: float) -> None:
        engine = self.engine
        while self.events and self.events[0][0] <= end:
            when, _, (fn, args) = heapq.heappop(self.events)
            self.clock.now = when
            fn(*args)
            run(engine)
            for c in self.consumers:
                if c.sink.frames:
                    frames = [decode_frame(f) for f in c.sink.frames]
                    c.sink.frames.clear()
                    msgs = [m for f in frames for m in f]
                    self.at(self.clock.now + c.delay, self._arrive, c, msgs)
        self.clock.now = end
